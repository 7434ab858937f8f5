// Command loadcurve loads N keys into one server (16 workers, txns of 100
// puts of 100-byte values, as the bench's loader, keys in a scattered order)
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

func main() {
	ep := flag.String("ep", "127.0.0.1:2379", "the server's client address (host:port)")
	n := flag.Int64("n", 1000000, "keys to load (a multiple of 100)")
	workers := flag.Int("w", 16, "concurrent writers")
	flag.Parse()
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
				lo := next.Add(100) - 100
				if lo >= *n {
					return
				}
				ops := make([]clientv3.Op, 0, 100)
				for i := lo; i < lo+100; i++ {
					ops = append(ops, clientv3.OpPut(fmt.Sprintf("user%016d", (i*2654435761)%(1<<40)), val))
				}
				if _, err := cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				done.Add(100)
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
