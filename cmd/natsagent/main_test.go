package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// The test binary is also the bench's worker process: bench starts
// os.Executable() with "bench-worker", which lands here.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "bench-worker" {
		os.Exit(run(context.Background(), os.Args[1:], stdio{in: os.Stdin, out: os.Stdout, err: os.Stderr}))
	}
	os.Exit(m.Run())
}

func runCLI(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, stdio{in: strings.NewReader(""), out: &out, err: &errOut})
	return code, out.String(), errOut.String()
}

func TestHelpListsCommands(t *testing.T) {
	code, out, _ := runCLI("help")
	if code != 0 || !strings.Contains(out, "bench ") || strings.Contains(out, "bench-worker") {
		t.Fatalf("help: %d\n%s", code, out)
	}
	if code, _, errOut := runCLI("help", "bench"); code != 0 || !strings.Contains(errOut, "--nats-url") && !strings.Contains(errOut, "-nats-url") {
		t.Fatalf("help bench: %d\n%s", code, errOut)
	}
	if code, _, errOut := runCLI(); code != 2 || !strings.Contains(errOut, "Usage") {
		t.Fatalf("no command: %d\n%s", code, errOut)
	}
	if code, _, errOut := runCLI("nope"); code != 2 || !strings.Contains(errOut, `unknown command "nope"`) {
		t.Fatalf("unknown command: %d\n%s", code, errOut)
	}
}

func TestBenchRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--concurrency", "0"},
		{"bench", "--concurrency", "a,b"},
		{"bench", "--runs"},
		{"bench", "extra"},
	} {
		if code, _, _ := runCLI(args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	if code, _, errOut := runCLI("bench", "--scenarios", "burst,nope"); code != 1 || !strings.Contains(errOut, `unknown scenario "nope"`) {
		t.Errorf("unknown scenario: %d %s", code, errOut)
	}
}

func TestBenchJSON(t *testing.T) {
	code, out, errOut := runCLI("bench", "--json", "--quiet",
		"--scenarios", "latency,scaling",
		"--concurrency", "2", "--idle-runs", "10", "--paced-rate", "200", "--paced-runs", "20",
		"--scaling-procs", "1", "--scaling-concurrency", "2", "--scaling-latency", "20ms", "--scaling-busy", "200ms",
		"--timeout", "60s")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		Rows []struct {
			Key   string  `json:"key"`
			Value float64 `json:"value"`
		} `json:"rows"`
		Scenarios []struct {
			Name  string `json:"name"`
			Error string `json:"error"`
		} `json:"scenarios"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	got := map[string]float64{}
	for _, r := range rep.Rows {
		got[r.Key] = r.Value
	}
	for _, k := range []string{"latency.idle.p50", "latency.paced.p99", "scaling.p1.throughput", "latency.idle.stored_per_run", "scaling.p1.stored_per_run"} {
		if got[k] <= 0 {
			t.Errorf("%s = %v", k, got[k])
		}
	}
	for _, s := range rep.Scenarios {
		if s.Error != "" {
			t.Errorf("%s: %s", s.Name, s.Error)
		}
	}
	if strings.Contains(errOut, "\r") {
		t.Error("--quiet drew a progress line")
	}
}
