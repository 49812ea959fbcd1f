package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/testdeploy"
)

// scriptModel answers by the conversation: a tool call for some user
// messages, slow text for "slow…", and after a tool result the result.
// Every call reports 10 tokens in and 5 out.
func scriptModel() *model.Scripted {
	return model.NewScripted(func(_ int, req *model.Request) model.Reply {
		usage := &model.Usage{PromptTokens: 10, CompletionTokens: 5, TotalTokens: 15}
		last := req.Messages[len(req.Messages)-1]
		if last.Role == model.RoleTool {
			if last.ToolCallID == "time1" {
				return model.Reply{Text: "The time is now.", Pieces: 3, Usage: usage}
			}
			return model.Reply{Text: "done: " + last.Content, Usage: usage}
		}
		u := req.LastUserContent()
		call := func(calls ...model.ToolCall) model.Reply { return model.Reply{ToolCalls: calls, Usage: usage} }
		switch {
		case u == "what time is it":
			return call(model.ToolCall{ID: "time1", Name: "current_time", Arguments: `{}`})
		case u == "write":
			return call(model.ToolCall{ID: "w1", Name: "write_file", Arguments: `{"path":"/a.txt","content":"A"}`})
		case u == "write two":
			return call(
				model.ToolCall{ID: "w1", Name: "write_file", Arguments: `{"path":"/a.txt","content":"A"}`},
				model.ToolCall{ID: "w2", Name: "write_file", Arguments: `{"path":"/b.txt","content":"B"}`})
		case u == "ask":
			return call(model.ToolCall{ID: "q1", Name: "ask_clarification", Arguments: `{"question":"Which city?","type":"missing_info"}`})
		case strings.HasPrefix(u, "slow"):
			return model.Reply{Text: strings.Repeat("word ", 60), Pieces: 60, PieceDelay: 50 * time.Millisecond, Usage: usage}
		}
		return model.Reply{Text: "echo: " + u, Pieces: 2, Usage: usage}
	})
}

// run streams the answer, shows the tool call as it happens with its
// result status, and ends with a line giving the status.
func TestRunStreamsTextAndToolCall(t *testing.T) {
	e := newCLIEnv(t, scriptModel())
	r := e.cli("run", "--thread", "t1", "what", "time", "is", "it").must(t, 0)
	r.has(t, "▸ current_time({})", "✓ success", "The time is now.", "■ success", "1 tool call", "tokens 20 in / 10 out")
	if strings.Index(r.out, "▸ current_time") > strings.Index(r.out, "The time is now.") {
		t.Fatalf("the tool call is not shown before the answer:\n%s", r.out)
	}
	r.says(t, "on thread t1")

	// Flags after the message, and --json: one envelope per line, ending
	// with run.finished.
	r = e.cli("run", "hello", "--thread", "t1", "--json").must(t, 0)
	evs := decodeEvents(t, r.out)
	if evs[0].Type != protocol.EventRunQueued || evs[len(evs)-1].Type != protocol.EventRunFinished {
		t.Fatalf("events %v", evs)
	}
	// The stored events count from 1; the deltas came live among them
	// (no seq), the answer's before its message.completed.
	stored, deltas := 0, ""
	for i, ev := range evs {
		if ev.ThreadID != "t1" || ev.V != protocol.EnvelopeVersion {
			t.Fatalf("event %d: thread %s v %d", i, ev.ThreadID, ev.V)
		}
		if ev.Live {
			var d protocol.DeltaData
			if ev.Type != protocol.EventMessageDelta || ev.Seq != 0 || json.Unmarshal(ev.Data, &d) != nil {
				t.Fatalf("live event %d: %+v", i, ev)
			}
			deltas += d.Delta
			continue
		}
		if stored++; ev.Seq != uint64(stored) {
			t.Fatalf("event %d: seq %d, want %d", i, ev.Seq, stored)
		}
		if ev.Type == protocol.EventMessageCompleted && deltas != "echo: hello" {
			t.Fatalf("message.completed after the deltas %q", deltas)
		}
	}
	var fin protocol.FinishedData
	if err := json.Unmarshal(evs[len(evs)-1].Data, &fin); err != nil || fin.Output == nil || fin.Output.Content != "echo: hello" {
		t.Fatalf("run.finished %s", evs[len(evs)-1].Data)
	}

	// The message may come on stdin.
	var out, errOut syncBuffer
	code := run(context.Background(), []string{"run", "--server", e.srv.URL(), "--prefix", testPrefix, "--thread", "t1"},
		stdio{in: strings.NewReader("from stdin\n"), out: &out, err: &errOut})
	if code != 0 || !strings.Contains(out.String(), "echo: from stdin") {
		t.Fatalf("stdin message: exit %d\n%s%s", code, out.String(), errOut.String())
	}
}

// A run that ends error exits non-zero with its reason, one a guard cut
// short exits 3; a run needs a message.
func TestRunExitStatus(t *testing.T) {
	e := newCLIEnv(t, scriptModel())
	r := e.cli("run", "--agent", "nope", "hi").must(t, 1)
	r.has(t, "■ error")
	r.says(t, "ended error")
	// A guard cut it short: exit 3, the answer so far, the guard named.
	r = e.cli("run", "--thread", "t3", "--max-steps", "1", "what time is it").must(t, 3)
	r.has(t, "[STOPPED: max_steps]", "■ incomplete · stop reason max_steps")
	r.says(t, "ended incomplete (max_steps)")
	if strings.Contains(r.out, "■ success") {
		t.Fatalf("an incomplete run printed success:\n%s", r.out)
	}
	e.cli("run", "--thread", "t1").must(t, 2).says(t, "no message")
	e.cli("run", "--thread", "bad.id", "hi").must(t, 2).says(t, "--thread")
}

// --detach prints only the run id; tail follows the run from its first
// event to its end, in text or JSON.
func TestDetachThenTail(t *testing.T) {
	e := newCLIEnv(t, scriptModel())
	r := e.cli("run", "--detach", "--thread", "t2", "slow answer").must(t, 0)
	id := strings.TrimSpace(r.out)
	if !protocol.ValidToken(id) {
		t.Fatalf("detach printed %q, want a run id", r.out)
	}
	r = e.cli("tail", "--run", id).must(t, 0)
	r.has(t, strings.Repeat("word ", 60), "■ success", "run "+id)

	// Finished: tail replays it and stops at run.finished.
	r = e.cli("tail", "--run", id, "--json").must(t, 0)
	evs := decodeEvents(t, r.out)
	if evs[0].Seq != 1 || evs[len(evs)-1].Type != protocol.EventRunFinished {
		t.Fatalf("replayed %d events, first seq %d, last %s", len(evs), evs[0].Seq, evs[len(evs)-1].Type)
	}
	// --detach --json is the pending record.
	r = e.cli("run", "--detach", "--json", "--thread", "t2", "--run-id", "r2", "hi").must(t, 0)
	var rec protocol.Run
	if err := json.Unmarshal([]byte(r.out), &rec); err != nil || rec.RunID != "r2" || rec.ThreadID != "t2" {
		t.Fatalf("detach --json: %v %s", err, r.out)
	}
	// The same run id again follows the existing run instead of running
	// another.
	r = e.cli("run", "--thread", "t2", "--run-id", "r2", "hi").must(t, 0)
	r.has(t, "■ success").says(t, "exists already")
	e.cli("run", "--thread", "other", "--run-id", "r2", "hi").must(t, 1).says(t, "already used by a run on thread t2")
}

// A finished run whose events expired is shown from its record; so is one
// whose events all lie before --since (the record is read when the feed
// stays silent).
func TestTailFromRecord(t *testing.T) {
	defer func(d time.Duration) { idleCheck = d }(idleCheck)
	idleCheck = 300 * time.Millisecond
	e := newCLIEnv(t, scriptModel())
	e.cli("run", "--thread", "tx", "--run-id", "gone", "hello").must(t, 0)
	e.cli("run", "--thread", "tx", "--run-id", "old", "again").must(t, 0)

	r := e.cli("tail", "--run", "old", "--since", "2099-01-01T00:00:00Z").must(t, 0)
	r.has(t, "echo: again", "■ success · run old")

	nc := e.srv.Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(context.Background(), e.settings.Names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(context.Background(), jetstream.WithPurgeSubject(e.settings.Names.RunEvents(protocol.DefaultTenant, "tx", "gone"))); err != nil {
		t.Fatal(err)
	}
	r = e.cli("tail", "--run", "gone").must(t, 0)
	r.has(t, "echo: hello", "■ success · run gone")
	r = e.cli("tail", "--run", "gone", "--json").must(t, 0)
	if evs := decodeEvents(t, r.out); len(evs) != 1 || evs[0].Type != protocol.EventRunFinished {
		t.Fatalf("expired run as JSON: %s", r.out)
	}
}

// A thread's tail shows each run under its own header, from the start
// with --from-start, and new runs as they come.
func TestTailThread(t *testing.T) {
	e := newCLIEnv(t, scriptModel())
	e.cli("run", "--thread", "t3", "--run-id", "first", "one").must(t, 0)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"tail", "--server", e.srv.URL(), "--prefix", testPrefix, "--thread", "t3", "--from-start"},
			stdio{in: strings.NewReader(""), out: &out, err: &errOut})
	}()
	testdeploy.WaitFor(t, 10*time.Second, "the first run replayed", func() bool { return strings.Contains(out.String(), "echo: one") })
	e.cli("run", "--thread", "t3", "--run-id", "second", "two").must(t, 0)
	testdeploy.WaitFor(t, 10*time.Second, "the second run followed to its end", func() bool { return strings.Contains(out.String(), "■ success · run second") })
	cancel()
	if code := natstest.Recv(t, done, "tail to exit"); code != 0 {
		t.Fatalf("tail exit %d: %s", code, errOut.String())
	}
	got := out.String()
	for _, want := range []string{"── run first queued", "── run second queued", "■ success · run first", "■ success · run second"} {
		if !strings.Contains(got, want) {
			t.Fatalf("thread tail lacks %q:\n%s", want, got)
		}
	}
}

// Ctrl-C detaches: the command says how to follow the run again, and the
// run goes on to its end.
func TestRunCtrlCDetaches(t *testing.T) {
	e := newCLIEnv(t, scriptModel())
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"run", "--server", e.srv.URL(), "--prefix", testPrefix, "--thread", "t4", "--run-id", "long", "slow please"},
			stdio{in: strings.NewReader(""), out: &out, err: &errOut})
	}()
	testdeploy.WaitFor(t, 10*time.Second, "the answer streaming", func() bool { return strings.Contains(out.String(), "word") })
	cancel()
	if code := natstest.Recv(t, done, "run to exit after Ctrl-C"); code != 0 {
		t.Fatalf("exit %d after Ctrl-C", code)
	}
	if !strings.Contains(errOut.String(), "natsagent tail --run long") || strings.Contains(out.String(), "■") {
		t.Fatalf("detach:\n%s\n%s", out.String(), errOut.String())
	}
	e.waitStatus("long", protocol.StatusSuccess)
}

// runs lists a thread's runs newest first; threads lists threads most
// recently active first, with a limit.
func TestRunsAndThreads(t *testing.T) {
	e := newCLIEnv(t, scriptModel())
	e.cli("run", "--thread", "ta", "--run-id", "ra1", "one").must(t, 0)
	e.cli("run", "--thread", "ta", "--run-id", "ra2", "two").must(t, 0)
	e.cli("run", "--thread", "tb", "--run-id", "rb1", "three").must(t, 0)
	e.cli("run", "--thread", "tb", "--run-id", "rb2", "--agent", "nope", "four").must(t, 1)

	r := e.cli("runs", "--thread", "ta").must(t, 0)
	lines := strings.Split(strings.TrimSpace(r.out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "RUN") || !strings.HasPrefix(lines[1], "ra2") || !strings.HasPrefix(lines[2], "ra1") {
		t.Fatalf("runs:\n%s", r.out)
	}
	if !strings.Contains(lines[1], "success") {
		t.Fatalf("runs shows no status:\n%s", r.out)
	}
	r = e.cli("runs", "--thread", "tb", "--status", "error", "--json").must(t, 0)
	var recs []protocol.Run
	if err := json.Unmarshal([]byte(r.out), &recs); err != nil || len(recs) != 1 || recs[0].RunID != "rb2" {
		t.Fatalf("runs --json: %v\n%s", err, r.out)
	}
	e.cli("runs", "--thread", "tb").must(t, 0).has(t, "rb2", "error", "unknown agent")

	r = e.cli("threads").must(t, 0)
	lines = strings.Split(strings.TrimSpace(r.out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "tb") || !strings.HasPrefix(lines[2], "ta") {
		t.Fatalf("threads:\n%s", r.out)
	}
	r = e.cli("threads", "--limit", "1", "--json").must(t, 0)
	var ths []protocol.Thread
	if err := json.Unmarshal([]byte(r.out), &ths); err != nil || len(ths) != 1 || ths[0].ThreadID != "tb" {
		t.Fatalf("threads --limit 1 --json: %v\n%s", err, r.out)
	}
	e.cli("threads", "--limit", "1").must(t, 0).says(t, "1 more")
	e.cli("threads", "--tenant", "other").must(t, 0).says(t, "no threads in tenant other")
}

// cancel stops a running run; the command that follows it exits non-zero
// with the cancelled status.
func TestCancel(t *testing.T) {
	e := newCLIEnv(t, scriptModel())
	var wg sync.WaitGroup
	var following result
	wg.Add(1)
	go func() {
		defer wg.Done()
		following = e.cli("run", "--thread", "t5", "--run-id", "victim", "slow please")
	}()
	e.waitStatus("victim", protocol.StatusRunning)
	e.cli("cancel", "victim").must(t, 0).has(t, "run victim cancelled")
	natstest.Wait(t, &wg, "the followed run of the cancelled victim to end")
	following.must(t, 1).has(t, "■ cancelled")
	if !strings.Contains(following.err, "run victim ended cancelled") {
		t.Fatalf("no reason on stderr:\n%s", following)
	}
	e.cli("cancel", "--run", "victim", "--json").must(t, 1).says(t, "already finished")
}

// steer sends a message that preempts the thread's active run, and
// follows the new run.
func TestSteer(t *testing.T) {
	e := newCLIEnv(t, scriptModel())
	e.cli("run", "--detach", "--thread", "t6", "--run-id", "busy", "slow please").must(t, 0)
	e.waitStatus("busy", protocol.StatusRunning)
	r := e.cli("steer", "--thread", "t6", "--run-id", "turn", "change", "course").must(t, 0)
	r.has(t, "echo: change course", "■ success")
	if rec := e.waitStatus("busy", protocol.StatusSteered); rec.SupersededBy != "turn" {
		t.Fatalf("steered run superseded by %q", rec.SupersededBy)
	}
	e.cli("tail", "--run", "busy").must(t, 0).has(t, "■ steered", "superseded by run turn")
}

// A write_file call waits for approval with the default approval
// middleware; approve runs it, approve by number runs only those and
// rejects the others, reject runs none and tells the model why, and
// answer answers a clarification.
func TestApproveRejectAnswer(t *testing.T) {
	e := newCLIEnv(t, scriptModel())
	ctx := context.Background()
	exists := func(thread, path string) bool {
		_, err := e.workdir(protocol.DefaultTenant, thread).Read(ctx, path)
		return err == nil
	}

	r := e.cli("run", "--thread", "ap", "write").must(t, 0)
	r.has(t, "■ interrupted", "1 tool call wait for approval", "1. write_file(", "natsagent approve --thread ap")
	e.cli("approve", "--thread", "ap", "--list").must(t, 0).has(t, "1. write_file(", `"/a.txt"`)
	e.cli("answer", "--thread", "ap", "Lyon").must(t, 1).says(t, "waits for approval of 1 tool call")
	if exists("ap", "/a.txt") {
		t.Fatal("write_file ran before approval")
	}
	r = e.cli("approve", "--thread", "ap").must(t, 0)
	r.has(t, "▸ write_file(", "✓ success", "■ success").says(t, "→ approve")
	if !exists("ap", "/a.txt") {
		t.Fatal("approved write_file did not write")
	}
	e.cli("approve", "--thread", "ap").must(t, 1).says(t, "thread ap is not waiting for a person")

	e.cli("run", "--thread", "two", "write two").must(t, 0).has(t, "2 tool calls wait for approval", "2. write_file(")
	e.cli("approve", "--thread", "two", "3").must(t, 1).says(t, "there is no call 3")
	r = e.cli("approve", "--thread", "two", "2", "--message", "not a.txt").must(t, 0).has(t, "■ success")
	r.says(t, "1. write_file", "→ reject: not a.txt", "2. write_file", "→ approve")
	if exists("two", "/a.txt") || !exists("two", "/b.txt") {
		t.Fatalf("approve 2 wrote a.txt=%v b.txt=%v", exists("two", "/a.txt"), exists("two", "/b.txt"))
	}

	// The whole answer as JSON: an edit runs the call with the person's
	// arguments; decisions that do not fit are refused before anything
	// is published.
	e.cli("run", "--thread", "ed", "write").must(t, 0)
	e.cli("approve", "--thread", "ed", "--decisions", `[{"type":"approve"},{"type":"approve"}]`).must(t, 1).says(t, "2 decisions for 1 tool calls")
	e.cli("approve", "--thread", "ed", "--decisions", `[{"type":"edit","arguments":{"path":"/c.txt","content":"C"}}]`).must(t, 0).has(t, "■ success")
	if exists("ed", "/a.txt") || !exists("ed", "/c.txt") {
		t.Fatal("the edited call did not run with the person's arguments")
	}

	e.cli("run", "--thread", "rj", "write").must(t, 0)
	r = e.cli("reject", "--thread", "rj", "keep", "it", "as", "it", "is").must(t, 0)
	r.has(t, "keep it as it is", "■ success")
	if exists("rj", "/a.txt") {
		t.Fatal("a rejected write_file ran")
	}

	r = e.cli("run", "--thread", "cl", "ask").must(t, 0)
	r.has(t, "■ interrupted", "? Which city?", `natsagent answer --thread cl "your answer"`)
	e.cli("approve", "--thread", "cl").must(t, 1).says(t, `waits for an answer to "Which city?"`)
	e.cli("answer", "--thread", "cl", "Lyon").must(t, 0).has(t, "Lyon", "■ success")
}

// usage shows a run's and a thread's token usage from the usage bucket.
func TestUsage(t *testing.T) {
	e := newCLIEnv(t, scriptModel())
	e.cli("run", "--thread", "tu", "--run-id", "u1", "what time is it").must(t, 0)
	e.cli("run", "--thread", "tu", "--run-id", "u2", "hello").must(t, 0)

	var ru protocol.RunUsage
	if err := json.Unmarshal([]byte(e.cli("usage", "--run", "u1", "--json").must(t, 0).out), &ru); err != nil {
		t.Fatal(err)
	}
	if !ru.Final || ru.Total.Calls != 2 || ru.Total.Input != 20 || ru.Total.Output != 10 {
		t.Fatalf("run usage %+v", ru.Total.TokenCounts)
	}
	e.cli("usage", "--run", "u1").must(t, 0).has(t, "run u1 on thread tu (final)", "total", "20", "10", "30")

	// The thread's total is written just after each run ends.
	var tu protocol.ThreadUsage
	testdeploy.WaitFor(t, 10*time.Second, "the thread's usage", func() bool {
		tu = protocol.ThreadUsage{}
		return json.Unmarshal([]byte(e.cli("usage", "--thread", "tu", "--json").out), &tu) == nil && tu.Total.Calls == 3
	})
	if tu.Total.Input != 30 || len(tu.Runs) != 2 {
		t.Fatalf("thread usage %+v", tu)
	}
	e.cli("usage", "--thread", "tu").must(t, 0).has(t, "thread tu: 2 runs", "run u1", "run u2")
	e.cli("usage").must(t, 2)
}

// Errors name what was wrong and how to go on.
func TestErrorMessages(t *testing.T) {
	e := newCLIEnv(t, scriptModel())
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"tail", "--run", "nope"}, "run nope not found in tenant default"},
		{[]string{"tail", "--thread", "nope"}, "thread nope not found in tenant default"},
		{[]string{"runs", "--thread", "nope"}, "thread nope not found"},
		{[]string{"cancel", "--run", "nope"}, "run nope not found"},
		{[]string{"cancel", "--run", "nope", "--thread", "t1"}, "no run nope on thread t1"},
		{[]string{"steer", "--thread", "nope", "hi"}, "thread nope not found"},
		{[]string{"approve", "--thread", "nope"}, "thread nope not found"},
		{[]string{"answer", "--thread", "nope", "x"}, "thread nope not found"},
		{[]string{"usage", "--run", "nope"}, "run nope not found"},
		{[]string{"usage", "--thread", "nope"}, "thread nope not found"},
		{[]string{"runs", "--thread", "nope", "--prefix", "other"}, `no natsagent deployment with prefix "other"`},
	} {
		r := e.cli(c.args...)
		if r.code != 1 || !strings.Contains(r.err, c.want) {
			t.Errorf("%v: want exit 1 and %q, got %s", c.args, c.want, r)
		}
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", closedPort(t))
	for _, cmd := range [][]string{{"threads"}, {"run", "hi"}, {"tail", "--thread", "t1"}} {
		r := invoke(context.Background(), append(cmd, "--server", url)...)
		if r.code != 1 || !strings.Contains(r.err, "cannot reach NATS at "+url) || !strings.Contains(r.err, "--server") {
			t.Errorf("%v on a closed port: %s", cmd, r)
		}
	}
	t.Setenv("NATS_URL", url)
	if r := invoke(context.Background(), "threads"); r.code != 1 || !strings.Contains(r.err, "cannot reach NATS at "+url) {
		t.Errorf("NATS_URL on a closed port: %s", r)
	}
}

// --config reads the deployment's file for its NATS URL and prefix, as
// the binaries do; flags win over it.
func TestConfigFile(t *testing.T) {
	e := newCLIEnv(t, scriptModel())
	e.cli("run", "--thread", "cf", "hi").must(t, 0)
	path := filepath.Join(t.TempDir(), "natsagent.yaml")
	yaml := fmt.Sprintf("nats:\n  url: %s\n  prefix: %s\n", e.srv.URL(), testPrefix)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	invoke(context.Background(), "threads", "--config", path).must(t, 0).has(t, "cf")
	r := invoke(context.Background(), "threads", "--config", path, "--prefix", "agent")
	if r.code != 1 || !strings.Contains(r.err, `prefix "agent"`) {
		t.Fatalf("--prefix over --config: %s", r)
	}
	// Model settings in the environment, incomplete for the binaries,
	// are not the CLI's business without a file.
	t.Setenv("OPENAI_API_KEY", "sk-test")
	e.cli("threads").must(t, 0).has(t, "cf")
	if err := os.WriteFile(path, []byte("nats:\n  replicas: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	invoke(context.Background(), "threads", "--config", path).must(t, 1).says(t, "nats.replicas")
}

func TestDisplayURLsMasksUserInfo(t *testing.T) {
	got := displayURLs("nats://bob:secret@h1:4222, nats://h2:4222,tls://tok@h3:4443")
	if want := "nats://***@h1:4222,nats://h2:4222,tls://***@h3:4443"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestParseArgs(t *testing.T) {
	fs := newFlagSet("x", "", "", stdio{err: &syncBuffer{}})
	a := fs.String("a", "", "")
	b := fs.Bool("b", false, "")
	pos, err := parseArgs(fs, []string{"one", "--a", "v", "two", "-b", "--", "--a", "three"})
	if err != nil || *a != "v" || !*b || strings.Join(pos, "|") != "one|two|--a|three" {
		t.Fatalf("pos %q a %q b %v err %v", pos, *a, *b, err)
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	if got, err := parseSince("10m", now); err != nil || !got.Equal(now.Add(-10*time.Minute)) {
		t.Fatalf("10m: %v %v", got, err)
	}
	if got, err := parseSince("2026-01-02T10:00:00Z", now); err != nil || got.Hour() != 10 {
		t.Fatalf("RFC 3339: %v %v", got, err)
	}
	for _, bad := range []string{"-5m", "yesterday"} {
		if _, err := parseSince(bad, now); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// compact queues a compaction job for an idle thread and prints its
// result; a busy or unknown thread is refused, --detach prints the job id.
func TestCompact(t *testing.T) {
	e := newCLIEnv(t, scriptModel())
	e.cli("run", "--thread", "tc", "hello").must(t, 0)

	// A short thread: the job runs and finds nothing old enough to cut.
	var d struct {
		Phase        string `json:"phase"`
		Reason       string `json:"reason"`
		JobID        string `json:"job_id"`
		TokensBefore int    `json:"tokens_before"`
	}
	out := e.cli("compact", "--thread", "tc", "--job-id", "c1", "--json").must(t, 0).out
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if d.Phase != "completed" || d.Reason != "request" || d.JobID != "c1" || d.TokensBefore == 0 {
		t.Fatalf("result %+v", d)
	}
	e.cli("compact", "tc").must(t, 0).has(t, "thread tc: nothing old enough to summarize")

	if id := strings.TrimSpace(e.cli("compact", "--thread", "tc", "--detach").must(t, 0).out); !protocol.ValidToken(id) {
		t.Fatalf("--detach printed %q, want a job id", id)
	}
	if r := e.cli("compact", "--thread", "nope"); r.code != 1 || !strings.Contains(r.err, "thread nope not found") {
		t.Fatalf("unknown thread: %s", r)
	}
	e.cli("compact").must(t, 2)

	// A thread whose run is streaming is not compacted under it.
	e.cli("run", "--thread", "tb", "--detach", "slow answer").must(t, 0)
	testdeploy.WaitFor(t, 10*time.Second, "the slow run to hold its thread", func() bool {
		th, _, err := e.stores.Threads.Get(context.Background(), protocol.DefaultTenant, "tb")
		return err == nil && th.Lease != nil
	})
	if r := e.cli("compact", "--thread", "tb"); r.code != 1 || !strings.Contains(r.err, "is busy with run") {
		t.Fatalf("busy thread: %s", r)
	}
}

// Events that trail the run's terminal record (the record is written
// first; a worker whose lease fence paused holds its events) are shown:
// the record ends a silent follow only after one more silent idleCheck.
// Before, the follow printed the record's answer alone, without the tool
// call that led to it.
func TestTailShowsEventsThatTrailTheRecord(t *testing.T) {
	defer func(d time.Duration) { idleCheck = d }(idleCheck)
	idleCheck = 2 * time.Second
	e := newCLIEnv(t, scriptModel())
	e.cli("run", "--thread", "ty", "--run-id", "late", "what", "time", "is", "it").must(t, 0)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc := e.srv.Connect()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	subject := e.settings.Names.RunEvents(protocol.DefaultTenant, "ty", "late")
	st, err := js.Stream(ctx, e.settings.Names.EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
	if err != nil {
		t.Fatal(err)
	}
	var stored [][]byte
	for {
		batch, err := cons.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			stored = append(stored, m.Data())
			n++
		}
		if n == 0 {
			break
		}
	}
	if len(stored) < 4 {
		t.Fatalf("the run stored %d events", len(stored))
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
		t.Fatal(err)
	}
	// The events come back once the follow has seen the ended record.
	republished := make(chan error, 1)
	testHookRecordEnded = func() {
		for _, data := range stored {
			if _, err := js.Publish(ctx, subject, data); err != nil {
				republished <- err
				return
			}
		}
		republished <- nil
	}
	defer func() { testHookRecordEnded = nil }()

	r := e.cli("tail", "--run", "late").must(t, 0)
	if err := natstest.Recv(t, republished, "the events republished after the record was read"); err != nil {
		t.Fatal(err)
	}
	r.has(t, "▸ current_time({})", "The time is now.", "■ success · run late")
}
