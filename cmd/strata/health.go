package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// runHealth implements `strata health`: it asks a member's /health endpoint
// whether the member is healthy, as `etcdctl endpoint health` does, and
// exits 0 only if it is. A container built FROM scratch has no shell and no
// curl, so this is the health check its orchestrator runs (deploy/).
func runHealth(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("strata health", flag.ContinueOnError)
	fs.SetOutput(stderr)
	endpoint := fs.String("endpoint", "http://127.0.0.1:2379", "The member's client or metrics URL (http or https; https is verified against the system's roots).")
	timeout := fs.Duration("timeout", 5*time.Second, "How long to wait for the answer.")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "strata health: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	healthy, reason, err := checkHealth(*endpoint, *timeout)
	if err != nil {
		fmt.Fprintf(stderr, "strata health: %s is unhealthy: %v\n", *endpoint, err)
		return 1
	}
	if !healthy {
		fmt.Fprintf(stderr, "strata health: %s is unhealthy: %s\n", *endpoint, reason)
		return 1
	}
	fmt.Fprintf(stdout, "%s is healthy\n", *endpoint)
	return 0
}

// checkHealth reads etcd's /health answer, {"health":"true","reason":""}.
func checkHealth(endpoint string, timeout time.Duration) (healthy bool, reason string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(endpoint, "/")+"/health", nil)
	if err != nil {
		return false, "", fmt.Errorf("bad endpoint: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return false, "", fmt.Errorf("read /health: %w", err)
	}
	var h struct {
		Health string `json:"health"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(body, &h); err != nil {
		return false, "", fmt.Errorf("/health answered %s, not etcd's JSON: %q", resp.Status, body)
	}
	if h.Health != "true" {
		return false, fmt.Sprintf("%s (%s)", h.Reason, resp.Status), nil
	}
	return true, "", nil
}
