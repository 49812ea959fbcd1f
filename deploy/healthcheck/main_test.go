package main

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func TestProbe(t *testing.T) {
	var status atomic.Int32
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			time.Sleep(200 * time.Millisecond)
		}
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()

	if err := probe(srv.URL+"/readyz", time.Second); err != nil {
		t.Fatalf("200: %v", err)
	}
	status.Store(http.StatusServiceUnavailable)
	if err := probe(srv.URL+"/readyz", time.Second); err == nil {
		t.Fatal("503 passed the probe")
	}
	status.Store(http.StatusOK)
	if err := probe(srv.URL+"/slow", 50*time.Millisecond); err == nil {
		t.Fatal("a probe past its timeout passed")
	}
	srv.Close()
	if err := probe(srv.URL+"/readyz", time.Second); err == nil {
		t.Fatal("a closed server passed the probe")
	}
}
