package main

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/natstest"
)

// The probes deploy/k8s and deploy/compose.yaml rely on: ready while
// connected, unready once shutdown begins or NATS is gone, alive
// throughout (a liveness failure during the grace would kill runs).
func TestHealthEndpoints(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	ctx, shutdown := context.WithCancel(context.Background())
	defer shutdown()
	addr := freeAddr(t)
	stop, err := serveHealth(ctx, addr, nc, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	expect := func(path string, want int) {
		t.Helper()
		var got int
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			resp, err := http.Get("http://" + addr + path)
			if err == nil {
				got = resp.StatusCode
				_ = resp.Body.Close()
				if got == want {
					return
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("GET %s: %d, want %d", path, got, want)
	}
	expect("/healthz", http.StatusOK)
	expect("/readyz", http.StatusOK)

	shutdown()
	expect("/readyz", http.StatusServiceUnavailable)
	expect("/healthz", http.StatusOK)

	// A fresh server whose NATS connection is gone is unready too.
	stop()
	nc.Close()
	stop, err = serveHealth(context.Background(), addr, nc, zap.NewNop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	expect("/readyz", http.StatusServiceUnavailable)
	expect("/healthz", http.StatusOK)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}

func TestHealthListenError(t *testing.T) {
	srv := natstest.Start(t)
	if _, err := serveHealth(context.Background(), "256.0.0.1:1", srv.Connect(), zap.NewNop(), nil); err == nil {
		t.Fatal("listening on an invalid address succeeded")
	}
}
