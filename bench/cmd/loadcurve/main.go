// Command loadcurve loads N keys into one server (16 workers, txns of 100
// puts of 100-byte values, as the bench's loader, keys in a scattered order;
// -w and -txn change the workers and the puts per request)
// and prints the rate of every tenth of the keys, with what the server's
// /metrics says of its LSM (strata_pebble_*) and raft log fsyncs at the end
// of each tenth: whether the write rate holds as the data grows, and why
// not. load-restart.sh runs it against a fresh server and then times a
// restart after kill -9. Used for docs/bench/performance.md.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// scrape reads the strata_pebble_* and raft log counters from a /metrics
// page; a server without them (etcd) gives an empty map.
func scrape(url string) map[string]string {
	out := map[string]string{}
	resp, err := http.Get(url)
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "strata_pebble_") || strings.HasPrefix(l, "strata_raftlog_fsyncs_total") || strings.HasPrefix(l, "strata_raftlog_appends") {
			f := strings.Fields(l)
			out[f[0]] = f[1]
		}
	}
	return out
}

// key is the name of the i-th key loaded: scattered over the key space.
func key(i int64) string { return fmt.Sprintf("user%016d", (i*2654435761)%(1<<40)) }

func main() {
	ep := flag.String("ep", "127.0.0.1:2379", "the server's client address (host:port)")
	n := flag.Int64("n", 1000000, "keys to load (a multiple of -txn)")
	workers := flag.Int("w", 16, "concurrent writers")
	perTxn := flag.Int64("txn", 100, "puts per request: a txn of this many puts, or a plain Put if 1 (N must be a multiple)")
	flag.Parse()
	if *perTxn < 1 || *n%*perTxn != 0 {
		fmt.Fprintf(os.Stderr, "-txn %d must be >= 1 and divide -n %d\n", *perTxn, *n)
		os.Exit(2)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{*ep}, Logger: zap.NewNop()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(1)
	}
	val := strings.Repeat("v", 100)
	var next, done atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				lo := next.Add(*perTxn) - *perTxn
				if lo >= *n {
					return
				}
				var err error
				if *perTxn == 1 {
					_, err = cli.Put(context.Background(), key(lo), val)
				} else {
					ops := make([]clientv3.Op, 0, *perTxn)
					for i := lo; i < lo+*perTxn; i++ {
						ops = append(ops, clientv3.OpPut(key(i), val))
					}
					_, err = cli.Txn(context.Background()).Then(ops...).Commit()
				}
				if err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				done.Add(*perTxn)
			}
		}()
	}
	slice := *n / 10
	last, lastT := int64(0), start
	for d := done.Load(); d < *n; d = done.Load() {
		time.Sleep(20 * time.Millisecond)
		if d-last >= slice {
			now := time.Now()
			m := scrape("http://" + *ep + "/metrics")
			fmt.Printf("%8d keys %7.0f puts/s  l0=%s ramp=%s debt=%s stalls=%s stall_s=%s flushes=%s compactions=%s compacted=%s cache_hit=%s miss=%s fsyncs=%s\n",
				d, float64(d-last)/now.Sub(lastT).Seconds(), m["strata_pebble_l0_sublevels"], m["strata_pebble_read_amplification"], m["strata_pebble_compaction_debt_bytes"],
				m["strata_pebble_write_stalls_total"], m["strata_pebble_write_stall_seconds_total"], m["strata_pebble_flushes_total"], m["strata_pebble_compactions_total"],
				m["strata_pebble_compacted_bytes_total"], m["strata_pebble_block_cache_hits_total"], m["strata_pebble_block_cache_misses_total"], m["strata_raftlog_fsyncs_total"])
			last, lastT = d, now
		}
	}
	wg.Wait()
	fmt.Printf("total %d keys in %v: %.0f puts/s\n", *n, time.Since(start).Round(time.Millisecond), float64(*n)/time.Since(start).Seconds())
}
