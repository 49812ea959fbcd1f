// Command healthcheck probes an HTTP endpoint for container healthchecks:
// it exits 0 when GET url answers 2xx within two seconds, 1 otherwise.
// The images are distroless (no shell, no curl), so docker compose runs
// this static binary instead, against the gateway's /readyz or the
// worker's.
package main

import (
	"fmt"
	"net/http"
	"os"
	"time"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: healthcheck URL")
		os.Exit(2)
	}
	if err := probe(os.Args[1], 2*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "healthcheck:", err)
		os.Exit(1)
	}
}

func probe(url string, timeout time.Duration) error {
	client := &http.Client{Timeout: timeout}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("%s answered %s", url, resp.Status)
	}
	return nil
}
