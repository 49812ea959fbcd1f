package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// The compatibility tests drive gateway --dev's NATS server with other
// clients, as docs/protocol.md promises any NATS client can: the nats CLI
// (the README's commands) and the official JavaScript client. Without the
// client they skip, unless NATSAGENT_CLIENT_TESTS=1 (CI), where they fail
// (testdeploy.NeedClient).

// devServer is a gateway --dev child on loopback ports whose agents call
// an OpenAI-compatible test server.
type devServer struct {
	natsURL string
	model   *openaitest.Server
	stderr  *syncBuffer
}

// startDev starts gateway --dev with one worker, the model server answering
// with h, and config as its configuration file (none when empty); it is
// stopped when the test ends. Its ports are the system's choice: its JSON
// log names the NATS server's.
func startDev(t *testing.T, h openaitest.Handler, config string) *devServer {
	t.Helper()
	d := &devServer{model: openaitest.NewServer(t, h), stderr: &syncBuffer{}}
	args := []string{"--dev", "--data", filepath.Join(t.TempDir(), "data"), "--nats-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0",
		"--workers", "1", "--log-console=false"}
	if config != "" {
		path := filepath.Join(t.TempDir(), "natsagent.yaml")
		if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--config", path)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(devEnv(), "OPENAI_BASE_URL="+d.model.URL(), "OPENAI_API_KEY=test", "NATSAGENT_MODEL=test-model")
	cmd.Stderr = d.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		if err := cmd.Wait(); err != nil {
			t.Errorf("gateway --dev exited: %v\n%s", err, d.stderr.String())
		}
		if v := d.model.Violations(); len(v) > 0 {
			t.Errorf("the model server saw invalid requests: %v", v)
		}
	})
	// Ready once it serves its API (the hint comes after provisioning)
	// and its worker started.
	testdeploy.WaitFor(t, 90*time.Second, "gateway --dev's hint and its worker's start", func() bool {
		out := d.stderr.String()
		return strings.Contains(out, `"msg":"try it"`) && strings.Contains(out, "worker started")
	})
	for _, line := range strings.Split(d.stderr.String(), "\n") {
		var entry struct {
			Msg string `json:"msg"`
			URL string `json:"url"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "embedded NATS server with JetStream" {
			d.natsURL = entry.URL
		}
	}
	if d.natsURL == "" {
		t.Fatalf("gateway --dev did not log its NATS server's URL:\n%s", d.stderr.String())
	}
	return d
}

// client is a natsagent.Client on the dev server, for the Go side's
// assertions.
func (d *devServer) client(t *testing.T) *natsagent.Client {
	t.Helper()
	nc, err := nats.Connect(d.natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := natsagent.NewClient(nc, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// requireRun reads a run's record and requires its status.
func requireRun(t *testing.T, c *natsagent.Client, run string, status natsagent.Status) *natsagent.Run {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := c.Run(ctx, run)
	if err != nil {
		t.Fatalf("run %s: %v", run, err)
	}
	if rec.Status != status {
		t.Fatalf("run %s is %s, want %s: %+v", run, rec.Status, status, rec)
	}
	return rec
}

// jsDir is the pinned npm project of the official NATS JavaScript client
// (.ci/run installs it with npm ci).
const jsDir = "testdata/nats-js"

// jsModel calls remote__shout for a message asking to shout, answers a
// tool result with "got: <result>", streams slowly (thirty seconds) for a
// message containing "slow", and echoes anything else.
func jsModel(req *openaitest.Request) openaitest.Reply {
	last := req.LastMessage()
	switch {
	case last.Role == "tool":
		return openaitest.Text("got: " + last.Content)
	case strings.HasPrefix(last.Content, "shout "):
		args, _ := json.Marshal(map[string]string{"text": strings.TrimPrefix(last.Content, "shout ")})
		return openaitest.ToolCall("remote__shout", string(args))
	case strings.Contains(last.Content, "slow"):
		return openaitest.Reply{Text: strings.Repeat("tick ", 300), ChunkDelay: 100 * time.Millisecond}
	}
	return openaitest.Text("echo: " + last.Content)
}

// TestJSClient runs testdata/nats-js/protocol.mjs with the official NATS
// JavaScript client against gateway --dev: it serves a remote tool as a
// micro endpoint, submits runs to JetStream, follows their events with
// ordered consumers, reads their records, cancels and steers. The Go side
// checks what the script cannot see: the tool's result in the transcript
// the model got, and the records through natsagent.Client.
func TestJSClient(t *testing.T) {
	node := testdeploy.NodeJSClient(t, jsDir)
	d := startDev(t, jsModel, "agents:\n  - name: chatbot\n    tools: [current_time, \"remote:*\"]\n")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "protocol.mjs")
	cmd.Dir = jsDir
	cmd.Env = append(os.Environ(), "NATS_URL="+d.natsURL)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The script's runs need the worker to offer the tool: go on once it
	// found it (2.18, "Discovery").
	testdeploy.WaitFor(t, 60*time.Second, "the script's tool served and found by the worker", func() bool {
		return strings.Contains(out.String(), "tool served\n") &&
			strings.Contains(d.stderr.String(), "remote tool available") && strings.Contains(d.stderr.String(), "remote__shout")
	})
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	_ = stdin.Close()
	err = cmd.Wait()
	t.Logf("JS client checks:\n%s", out.String())
	if err != nil {
		t.Fatalf("the JS client checks failed: %v", err)
	}
	if !strings.Contains(out.String(), "\nchecks passed: 23\n") {
		t.Fatal("the script did not pass its 23 checks")
	}

	// The tool's reply reached the transcript as the call's result.
	var result string
	for _, req := range d.model.Requests() {
		last := req.LastMessage()
		if last.Role == "tool" {
			result = last.Content
		}
	}
	if result != "HELLO FROM JS" {
		t.Errorf("the model got the tool result %q, want HELLO FROM JS", result)
	}
	c := d.client(t)
	if rec := requireRun(t, c, "js-tool", natsagent.StatusSuccess); rec.Output == nil || rec.Output.Content != "got: HELLO FROM JS" {
		t.Errorf("js-tool's output: %+v", rec.Output)
	}
	requireRun(t, c, "js-cancel", natsagent.StatusCancelled)
	if rec := requireRun(t, c, "js-steer-1", natsagent.StatusSteered); rec.SupersededBy != "js-steer-2" {
		t.Errorf("js-steer-1 superseded by %q, want js-steer-2", rec.SupersededBy)
	}
	requireRun(t, c, "js-steer-2", natsagent.StatusSuccess)
}

// readmeCLI returns the commands of README.md's "Try it with the `nats`
// CLI" block, each as its words, keyed by its first two ("nats sub"), so
// the test runs what the README says. It fails on any shell syntax beyond
// single quotes and line continuations, which it would not run faithfully.
func readmeCLI(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Try it with the `nats` CLI")
	_, block, ok2 := strings.Cut(section, "\n```sh\n")
	block, _, ok3 := strings.Cut(block, "\n```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("README.md has no sh block under \"Try it with the `nats` CLI\"")
	}
	cmds := map[string][]string{}
	for _, line := range strings.Split(strings.ReplaceAll(block, "\\\n", " "), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		words, err := shellWords(line)
		if err != nil {
			t.Fatalf("README.md: %q: %v", line, err)
		}
		if len(words) < 2 || words[0] != "nats" {
			t.Fatalf("README.md: %q is not a nats command", line)
		}
		key := words[0] + " " + words[1]
		if cmds[key] != nil {
			t.Fatalf("README.md: two %q commands", key)
		}
		cmds[key] = words
	}
	return cmds
}

// shellWords splits a command line as sh would, for words that are plain
// or single-quoted; any other shell syntax is an error.
func shellWords(line string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord, quoted := false, false
	for _, r := range line {
		switch {
		case quoted && r == '\'':
			quoted = false
		case quoted:
			w.WriteRune(r)
		case r == '\'':
			quoted, inWord = true, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case strings.ContainsRune(`"$\|&;<>()*?[]{}~!#`+"`", r):
			return nil, fmt.Errorf("shell syntax %q the test does not run", r)
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote")
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// withRun is a README command with its run id r4 replaced by run.
func withRun(words []string, run string) []string {
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = strings.ReplaceAll(w, "r4", run)
	}
	return out
}

// cliEvent is an event line the nats CLI printed.
type cliEvent struct {
	Type  string          `json:"type"`
	Seq   int             `json:"seq"`
	Live  bool            `json:"live"`
	RunID string          `json:"run_id"`
	Data  json.RawMessage `json:"data"`
}

// cliEvents are the events of run among the JSON lines of a nats sub's
// output.
func cliEvents(out, run string) []cliEvent {
	var events []cliEvent
	for _, line := range strings.Split(out, "\n") {
		var e cliEvent
		if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &e) == nil && e.RunID == run {
			events = append(events, e)
		}
	}
	return events
}

// finished is the run.finished among events, if any.
func finished(events []cliEvent) (status, output string, ok bool) {
	for _, e := range events {
		if e.Type == "run.finished" {
			var d struct {
				Status string `json:"status"`
				Output struct {
					Content string `json:"content"`
				} `json:"output"`
			}
			_ = json.Unmarshal(e.Data, &d)
			return d.Status, d.Output.Content, true
		}
	}
	return "", "", false
}

// seqs lists events as "seq type", for failure messages.
func seqs(events []cliEvent) string {
	var b strings.Builder
	for _, e := range events {
		fmt.Fprintf(&b, "\n%d %s", e.Seq, e.Type)
	}
	return b.String()
}

// cliModel echoes the thread's first message, and streams slowly (thirty
// seconds) in any later run, long enough to cancel it.
func cliModel(req *openaitest.Request) openaitest.Reply {
	users := 0
	for _, m := range req.Messages {
		if m.Role == "user" {
			users++
		}
	}
	if users > 1 {
		return openaitest.Reply{Text: strings.Repeat("tick ", 300), ChunkDelay: 100 * time.Millisecond}
	}
	return openaitest.Text("echo: " + req.LastMessage().Content)
}

// TestNatsCLI runs README.md's "Try it with the `nats` CLI" commands, as
// written, with the nats CLI v0.5.0 (NATSAGENT_NATS_CLI, else nats on
// PATH) against gateway --dev: nats sub prints run r4's events in order
// up to run.finished, the same nats pub twice makes one run, nats kv get
// prints its record, and nats req cancels a running run (the same
// commands with run r5).
func TestNatsCLI(t *testing.T) {
	cli := os.Getenv("NATSAGENT_NATS_CLI")
	if cli == "" {
		cli = "nats"
	}
	missing := ""
	if _, err := exec.LookPath(cli); err != nil {
		missing = "the nats CLI is not installed (go install github.com/nats-io/natscli/nats@v0.5.0; NATSAGENT_NATS_CLI names it): " + err.Error()
	}
	testdeploy.NeedClient(t, missing)
	readme := readmeCLI(t)
	for _, k := range []string{"nats sub", "nats pub", "nats kv", "nats req"} {
		if readme[k] == nil {
			t.Fatalf("README.md's nats CLI block has no %q command", k)
		}
	}
	d := startDev(t, cliModel, "")
	// The CLI reads NATS_URL, as the README says, and no context of the
	// machine's user.
	env := append(os.Environ(), "NATS_URL="+d.natsURL, "NATS_CONTEXT=", "HOME="+t.TempDir(), "XDG_CONFIG_HOME="+t.TempDir())
	natsCLI := func(words []string) (stdout string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, cli, words[1:]...)
		cmd.Env = env
		var errOut strings.Builder
		cmd.Stderr = &errOut
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%q: %v\n%s%s", words, err, out, errOut.String())
		}
		return string(out)
	}

	sub := exec.Command(cli, readme["nats sub"][1:]...)
	sub.Env = env
	var subOut syncBuffer
	sub.Stdout, sub.Stderr = &subOut, &subOut
	if err := sub.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = sub.Process.Kill()
		_ = sub.Wait()
		t.Logf("nats sub printed:\n%s", subOut.String())
	}()
	// Subscribed once it prints what is published on its live subject.
	nc, err := nats.Connect(d.natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	testdeploy.WaitFor(t, 30*time.Second, "nats sub subscribed", func() bool {
		_ = nc.Publish("agent.live.default.demo.probe.messages", []byte("probe"))
		_ = nc.Flush()
		return strings.Contains(subOut.String(), "probe")
	})

	// Submit r4 twice: the stream stores one request, one run runs.
	natsCLI(readme["nats pub"])
	natsCLI(readme["nats pub"])
	testdeploy.WaitFor(t, 60*time.Second, "run.finished of r4 printed by nats sub", func() bool {
		_, _, ok := finished(cliEvents(subOut.String(), "r4"))
		return ok
	})
	events := cliEvents(subOut.String(), "r4")
	var stored []cliEvent
	deltas := ""
	for _, e := range events {
		if e.Live {
			var delta struct {
				Delta string `json:"delta"`
			}
			_ = json.Unmarshal(e.Data, &delta)
			deltas += delta.Delta
			continue
		}
		stored = append(stored, e)
	}
	for i, e := range stored {
		if e.Seq != i+1 {
			t.Fatalf("r4's stored events are not numbered 1..%d in order: %s", len(stored), seqs(stored))
		}
	}
	if last := stored[len(stored)-1]; last.Type != "run.finished" {
		t.Errorf("r4's last event is %s, want run.finished", last.Type)
	}
	if status, output, _ := finished(events); status != "success" || output != "echo: hi" {
		t.Errorf("r4 finished %q with %q, want success with \"echo: hi\"", status, output)
	}
	if deltas != "echo: hi" {
		t.Errorf("r4's live deltas make %q, want \"echo: hi\"", deltas)
	}
	started := 0
	for _, e := range stored {
		if e.Type == "run.started" {
			started++
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	runsStream, err := js.Stream(ctx, "AGENT_RUNS")
	if err != nil {
		t.Fatal(err)
	}
	info, err := runsStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if started != 1 || d.model.Count() != 1 || info.State.LastSeq != 1 {
		t.Errorf("two identical publishes: %d run.started, %d model calls, %d requests stored; want 1 of each", started, d.model.Count(), info.State.LastSeq)
	}

	var rec natsagent.Run
	if err := json.Unmarshal([]byte(natsCLI(readme["nats kv"])), &rec); err != nil {
		t.Fatalf("nats kv get --raw did not print a record: %v", err)
	}
	if rec.RunID != "r4" || rec.ThreadID != "demo" || rec.Status != natsagent.StatusSuccess || rec.Output == nil || rec.Output.Content != "echo: hi" {
		t.Errorf("nats kv get printed %+v, want r4 on demo, success, \"echo: hi\"", rec)
	}

	// Cancel r5 while it runs (the thread's second run streams slowly).
	natsCLI(withRun(readme["nats pub"], "r5"))
	testdeploy.WaitFor(t, 60*time.Second, "run.started of r5 printed by nats sub", func() bool {
		for _, e := range cliEvents(subOut.String(), "r5") {
			if e.Type == "run.started" {
				return true
			}
		}
		return false
	})
	var reply struct {
		RunID  string `json:"run_id"`
		Status string `json:"status"`
	}
	out := natsCLI(withRun(readme["nats req"], "r5"))
	if i := strings.Index(out, "{"); i < 0 || json.Unmarshal([]byte(strings.TrimSpace(out[i:])), &reply) != nil {
		t.Fatalf("nats req printed no cancel reply:\n%s", out)
	}
	if reply.RunID != "r5" || reply.Status != "cancelled" {
		t.Errorf("cancel reply %+v, want r5 cancelled", reply)
	}
	testdeploy.WaitFor(t, 60*time.Second, "run.finished of r5 printed by nats sub", func() bool {
		_, _, ok := finished(cliEvents(subOut.String(), "r5"))
		return ok
	})
	if status, _, _ := finished(cliEvents(subOut.String(), "r5")); status != "cancelled" {
		t.Errorf("r5 finished %q, want cancelled", status)
	}
	rec = natsagent.Run{}
	if err := json.Unmarshal([]byte(natsCLI(withRun(readme["nats kv"], "r5"))), &rec); err != nil || rec.Status != natsagent.StatusCancelled {
		t.Errorf("r5's record: %+v (%v), want cancelled", rec, err)
	}
}
