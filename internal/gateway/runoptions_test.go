package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/jobs"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/submit"
	"github.com/natsagent/natsagent/internal/testdeploy"
	"github.com/natsagent/natsagent/internal/webhook"
)

// startJobs runs a job runner as a worker's (delayed runs, webhooks),
// with a short backoff; it stops when the test ends.
func (e *env) startJobs(wh webhook.Config) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := zaptest.NewLogger(e.t)
	q, err := submit.NewQueue(ctx, e.js, e.settings.Names, e.stores, "scheduler", log)
	if err != nil {
		e.t.Fatal(err)
	}
	runner, err := jobs.NewRunner(ctx, e.js, jobs.Config{
		Settings: e.settings,
		Handlers: map[string]jobs.Handler{
			submit.DelayedJobKind: q.DelayedHandler(0, log),
			webhook.JobKind:       webhook.NewHandler(wh, e.stores, log).Handle,
		},
		Backoff: func(int) time.Duration { return 200 * time.Millisecond },
		Logger:  log,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = runner.Run(ctx); close(done) }()
	e.t.Cleanup(func() { cancel(); natstest.Recv(e.t, done, "the job runner to stop") })
}

// Every option natsagent does not serve is refused with its name; none
// is accepted and ignored.
func TestRunBodyRefusesWhatItDoesNotServe(t *testing.T) {
	e := newEnv(t, nil)
	for field, body := range map[string]map[string]any{
		"bogus":                             with(input("x"), "bogus", 1),
		"on_completion":                     with(input("x"), "on_completion", "delete"),
		"on_disconnect":                     with(input("x"), "on_disconnect", "abort"),
		"checkpoint_during":                 with(input("x"), "checkpoint_during", false),
		"durability":                        with(input("x"), "durability", "exit"),
		"feedback_keys":                     with(input("x"), "feedback_keys", []string{"score"}),
		"langsmith_tracer":                  with(input("x"), "langsmith_tracer", map[string]any{"project_name": "p"}),
		"after_seconds":                     with(input("x"), "after_seconds", -1),
		"interrupt_after":                   with(input("x"), "interrupt_after", []string{"tools"}),
		"interrupt_before":                  with(input("x"), "interrupt_before", "*"),
		"config.tags":                       with(input("x"), "config", map[string]any{"tags": []string{"a"}}),
		"config.recursion_limit":            with(input("x"), "config", map[string]any{"recursion_limit": 10}),
		"config.configurable.foo":           with(input("x"), "config", map[string]any{"configurable": map[string]any{"foo": 1}}),
		"config.configurable.checkpoint_id": with(input("x"), "config", map[string]any{"configurable": map[string]any{"checkpoint_id": "c1"}}),
		"context.foo":                       with(input("x"), "context", map[string]any{"foo": 1}),
		"webhook":                           with(input("x"), "webhook", "ftp://example.com/hook"),
	} {
		err := e.do("POST", "/threads/o1/runs", body).expect(t, http.StatusBadRequest).apiError(t)
		if err.Field != field {
			t.Errorf("%s: field %q: %s", field, err.Field, err.Message)
		}
	}
	// interrupt_before on something else than tools names what works.
	if err := e.do("POST", "/threads/o1/runs", with(input("x"), "interrupt_before", []string{"model"})).expect(t, http.StatusBadRequest).apiError(t); !strings.Contains(err.Message, `["tools"]`) {
		t.Errorf("interrupt_before model: %+v", err)
	}
	// Nothing was created.
	e.do("GET", "/threads/o1", nil).expect(t, http.StatusNotFound)
}

// The options that map onto natsagent settings reach the run request:
// context and config.configurable fill what config leaves empty,
// interrupt_before tools is approval of every call.
func TestRunOptionsBecomeTheRequest(t *testing.T) {
	s := &Server{cfg: Config{DefaultAgent: "chatbot"}}
	var b runBody
	body := `{"input":{"messages":[{"role":"user","content":"x"}]},"config":{"max_steps":3,"configurable":{"model":"m-conf","thread_id":"t1","checkpoint_ns":""}},
		"context":{"model":"m-ctx","user_id":"u1","max_steps":9},"interrupt_before":["tools"],"checkpoint_during":true,"durability":"sync",
		"stream_mode":["values"],"on_completion":"keep","metadata":{"k":"v"},"webhook":"https://example.com/h","after_seconds":0}`
	if err := json.Unmarshal([]byte(body), &b); err != nil {
		t.Fatal(err)
	}
	req, err := s.request(&b, "default", "t1")
	if err != nil {
		t.Fatal(err)
	}
	c := req.Config
	// config beats config.configurable, which beats context.
	if c.Model != "m-conf" || c.UserID != "u1" || c.MaxSteps != 3 || c.ToolApprovalMode != protocol.ApprovalAlwaysAsk {
		t.Fatalf("config %+v", c)
	}
	if req.Webhook != "https://example.com/h" || req.Metadata["k"] != "v" {
		t.Fatalf("request %+v", req)
	}
	b = runBody{}
	_ = json.Unmarshal([]byte(`{"input":{"messages":[{"role":"user","content":"x"}]},"interrupt_before":["tools"],"config":{"tool_approval_mode":"always_trust"}}`), &b)
	if _, err := s.request(&b, "default", "t1"); err == nil {
		t.Fatal("interrupt_before tools with always_trust accepted")
	}
}

// metadata is stored on the run and returned with it.
func TestRunMetadataStored(t *testing.T) {
	e := newEnv(t, echoModel())
	rec := e.finish("m1", with(input("hi"), "metadata", map[string]any{"source": "ui", "n": 2}))
	if rec.Metadata["source"] != "ui" || rec.Metadata["n"] != float64(2) {
		t.Fatalf("metadata %+v", rec.Metadata)
	}
}

// slowModel streams slowly when asked to ("slow"), and echoes otherwise.
func slowModel() *model.Scripted {
	return model.NewScripted(func(_ int, req *model.Request) model.Reply {
		last := ""
		for _, m := range req.Messages {
			if m.Role == model.RoleUser {
				last = m.Content
			}
		}
		if strings.Contains(last, "slow") {
			return model.Reply{Text: strings.Repeat("x ", 300), Pieces: 300, PieceDelay: 50 * time.Millisecond}
		}
		return model.Reply{Text: "echo: " + last}
	})
}

// runIDOf reads the run id a stream's first event carries.
func runIDOf(t *testing.T, s *stream) string {
	t.Helper()
	ev, ok := s.next(20 * time.Second)
	if !ok || ev.env.RunID == "" {
		t.Fatal("no first event with a run id")
	}
	return ev.env.RunID
}

// on_disconnect cancel: the client of a streaming create goes away and
// its run is cancelled; by default (continue) the run goes on.
func TestOnDisconnect(t *testing.T) {
	e := newEnv(t, slowModel())
	s := e.openStream("POST", "/threads/d1/runs/stream", with(input("slow please"), "on_disconnect", "cancel"))
	run := runIDOf(t, s)
	testdeploy.WaitFor(t, 20*time.Second, "run running", func() bool {
		return e.do("GET", "/threads/d1/runs/"+run, nil).run(t).Status == protocol.StatusRunning
	})
	s.close()
	if rec := e.awaitRun("d1", run); rec.Status != protocol.StatusCancelled {
		t.Fatalf("run after the client left: %+v", rec)
	}

	// The same for a wait.
	ctx, cancel := context.WithCancel(context.Background())
	body, _ := json.Marshal(with(input("slow again"), "on_disconnect", "cancel", "run_id", "wait1"))
	req, err := http.NewRequestWithContext(ctx, "POST", e.http.URL+"/threads/d3/runs/wait", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		resp, err := e.http.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	testdeploy.WaitFor(t, 20*time.Second, "waited run running", func() bool {
		r := e.do("GET", "/threads/d3/runs/wait1", nil)
		return r.status == http.StatusOK && r.run(t).Status == protocol.StatusRunning
	})
	cancel()
	<-errc
	if rec := e.awaitRun("d3", "wait1"); rec.Status != protocol.StatusCancelled {
		t.Fatalf("waited run after the client left: %+v", rec)
	}

	// Default: the run outlives its client.
	s = e.openStream("POST", "/threads/d2/runs/stream", input("hi"))
	run = runIDOf(t, s)
	s.close()
	if rec := e.awaitRun("d2", run); rec.Status != protocol.StatusSuccess {
		t.Fatalf("run after the client left (continue): %+v", rec)
	}
}

// A join stream with cancel_on_disconnect=1 cancels the run when its
// client leaves.
func TestJoinStreamCancelOnDisconnect(t *testing.T) {
	e := newEnv(t, slowModel())
	rec := e.do("POST", "/threads/j1/runs", input("slow please")).expect(t, http.StatusOK).run(t)
	s := e.openStream("GET", "/threads/j1/runs/"+rec.RunID+"/stream?cancel_on_disconnect=1", nil)
	testdeploy.WaitFor(t, 20*time.Second, "run running", func() bool {
		return e.do("GET", "/threads/j1/runs/"+rec.RunID, nil).run(t).Status == protocol.StatusRunning
	})
	s.close()
	if got := e.awaitRun("j1", rec.RunID); got.Status != protocol.StatusCancelled {
		t.Fatalf("run after the client left: %+v", got)
	}
}

// after_seconds: the run is pending until due, then runs as any other;
// its request waited in the jobs stream, not in a process.
func TestAfterSecondsDelaysTheRun(t *testing.T) {
	e := newEnv(t, echoModel())
	e.startJobs(webhook.Config{})
	sent := time.Now()
	rec := e.do("POST", "/threads/a1/runs", with(input("later"), "after_seconds", 1.5)).expect(t, http.StatusOK).run(t)
	if rec.Status != protocol.StatusPending {
		t.Fatalf("delayed run %+v", rec)
	}
	got := e.do("GET", "/threads/a1/runs/"+rec.RunID, nil).expect(t, http.StatusOK).run(t)
	if got.Status != protocol.StatusPending || got.StartedAt != nil {
		t.Fatalf("delayed run started at once: %+v", got)
	}
	done := e.awaitRun("a1", rec.RunID)
	if done.Status != protocol.StatusSuccess || done.Output == nil || done.Output.Content != "echo: later" {
		t.Fatalf("delayed run %+v", done)
	}
	if waited := done.StartedAt.Sub(sent); waited < 1500*time.Millisecond {
		t.Fatalf("the run started %s after it was sent, before its after_seconds", waited)
	}
}

// A delayed run cancelled before it is due never starts.
func TestAfterSecondsCancelBeforeStart(t *testing.T) {
	e := newEnv(t, echoModel())
	e.startJobs(webhook.Config{})
	rec := e.do("POST", "/threads/a2/runs", with(input("later"), "after_seconds", 1)).expect(t, http.StatusOK).run(t)
	var reply protocol.CancelReply
	e.do("POST", "/threads/a2/runs/"+rec.RunID+"/cancel", nil).expect(t, http.StatusOK).decode(t, &reply)
	if reply.Status != protocol.StatusCancelled {
		t.Fatalf("cancel reply %+v", reply)
	}
	// The job came due and was dropped: the jobs stream holds nothing.
	st, err := e.js.Stream(context.Background(), e.settings.Names.JobsStream())
	if err != nil {
		t.Fatal(err)
	}
	testdeploy.WaitFor(t, 30*time.Second, "the delayed job consumed", func() bool {
		info, err := st.Info(context.Background())
		return err == nil && info.State.Msgs == 0 && info.State.LastSeq >= 2
	})
	got := e.do("GET", "/threads/a2/runs/"+rec.RunID, nil).expect(t, http.StatusOK).run(t)
	if got.Status != protocol.StatusCancelled || got.StartedAt != nil {
		t.Fatalf("cancelled delayed run %+v", got)
	}
}

// Cancel with action=rollback stops the run, returns the thread to the
// checkpoint before it and deletes the run; action=interrupt keeps what
// the run did.
func TestCancelRollback(t *testing.T) {
	m := slowModel()
	e := newEnv(t, m)
	e.finish("r1", input("hi"))
	before, _, err := e.stores.Threads.Get(context.Background(), "default", "r1")
	if err != nil {
		t.Fatal(err)
	}
	start := func(thread string) string {
		rec := e.do("POST", "/threads/"+thread+"/runs", input("slow and doomed")).expect(t, http.StatusOK).run(t)
		testdeploy.WaitFor(t, 20*time.Second, "run running", func() bool {
			return e.do("GET", "/threads/"+thread+"/runs/"+rec.RunID, nil).run(t).Status == protocol.StatusRunning
		})
		return rec.RunID
	}
	run := start("r1")
	var reply protocol.CancelReply
	e.do("POST", "/threads/r1/runs/"+run+"/cancel?wait=1&action=rollback", nil).expect(t, http.StatusOK).decode(t, &reply)
	if reply.Status != protocol.StatusCancelled {
		t.Fatalf("rollback reply %+v", reply)
	}
	e.do("GET", "/threads/r1/runs/"+run, nil).expect(t, http.StatusNotFound)
	after, _, err := e.stores.Threads.Get(context.Background(), "default", "r1")
	if err != nil {
		t.Fatal(err)
	}
	if after.Head != before.Head {
		t.Fatalf("head %s after the rollback, want %s (before the run)", after.Head, before.Head)
	}
	if hasMessage(t, e, "r1", "slow and doomed") {
		t.Fatal("the rolled-back run's message is still in the thread")
	}

	// action=interrupt (the default): the run's input stays once the run
	// took it (a run cancelled before its first step has none to keep),
	// so the cancel waits for the model to be answering it.
	e.finish("r2", input("hi"))
	calls := m.Calls()
	run = start("r2")
	testdeploy.WaitFor(t, 20*time.Second, "the model answers the run", func() bool { return m.Calls() > calls })
	e.do("POST", "/threads/r2/runs/"+run+"/cancel?action=interrupt", nil).expect(t, http.StatusOK)
	if got := e.awaitRun("r2", run); got.Status != protocol.StatusCancelled {
		t.Fatalf("cancelled run %+v", got)
	}
	if !hasMessage(t, e, "r2", "slow and doomed") {
		t.Fatal("the cancelled run's message is gone")
	}
	e.do("POST", "/threads/r2/runs/"+run+"/cancel?action=undo", nil).expect(t, http.StatusBadRequest)
}

func hasMessage(t *testing.T, e *env, thread, content string) bool {
	t.Helper()
	th, _, err := e.stores.Threads.Get(context.Background(), "default", thread)
	if err != nil {
		t.Fatal(err)
	}
	st, _, err := e.stores.Checkpoints.Load(context.Background(), "default", thread, th.Head)
	if err != nil && !errors.Is(err, kv.ErrNotFound) {
		t.Fatal(err)
	}
	for _, m := range st.Messages {
		if m.Content == content {
			return true
		}
	}
	return false
}

// hookServer records webhook deliveries; fail says how many first
// deliveries it answers 500.
type hookServer struct {
	*httptest.Server
	mu   sync.Mutex
	got  []delivery
	fail int
}

type delivery struct {
	header http.Header
	body   []byte
}

func newHookServer(t *testing.T, fail int) *hookServer {
	h := &hookServer{fail: fail}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.got = append(h.got, delivery{header: r.Header.Clone(), body: body})
		n := len(h.got)
		h.mu.Unlock()
		if n <= h.fail {
			http.Error(w, "not now", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *hookServer) deliveries() []delivery {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]delivery(nil), h.got...)
}

func awaitWebhook(t *testing.T, e *env, thread, run, status string) protocol.Run {
	t.Helper()
	var rec protocol.Run
	testdeploy.WaitFor(t, 30*time.Second, "webhook "+status, func() bool {
		rec = e.do("GET", "/threads/"+thread+"/runs/"+run, nil).expect(t, http.StatusOK).run(t)
		return rec.Webhook != nil && rec.Webhook.Status == status
	})
	return rec
}

// The final run is POSTed to the webhook once it ended, signed with the
// deployment's secret; a failed POST is retried, and the delivery's state
// is on the run.
func TestWebhookDelivered(t *testing.T) {
	e := newEnvWith(t, echoModel(), func(s *Server) { s.cfg.WebhookAllowPrivate = true })
	e.startJobs(webhook.Config{Secret: "s3cret", AllowPrivate: true, MaxAttempts: 5})
	hook := newHookServer(t, 1)
	rec := e.finish("w1", with(input("hi"), "webhook", hook.URL+"/done?x=1"))
	got := awaitWebhook(t, e, "w1", rec.RunID, protocol.WebhookSent)
	if got.Webhook.Attempts != 2 || got.Webhook.SentAt == nil || got.Webhook.LastError != "" {
		t.Fatalf("webhook state %+v", got.Webhook)
	}
	ds := hook.deliveries()
	if len(ds) != 2 {
		t.Fatalf("%d deliveries, want 2 (one failed, one retried)", len(ds))
	}
	last := ds[1]
	if sig := last.header.Get(webhook.HeaderSignature); sig != webhook.Sign("s3cret", last.body) {
		t.Fatalf("signature %q does not sign the body", sig)
	}
	var sent protocol.Run
	if err := json.Unmarshal(last.body, &sent); err != nil {
		t.Fatal(err)
	}
	if sent.RunID != rec.RunID || sent.Status != protocol.StatusSuccess || sent.Output == nil || sent.Output.Content != "echo: hi" || sent.Webhook != nil {
		t.Fatalf("delivered run %s", last.body)
	}
}

// Failures are visible on the run: every attempt failed, the last error.
func TestWebhookFailureVisible(t *testing.T) {
	e := newEnvWith(t, echoModel(), func(s *Server) { s.cfg.WebhookAllowPrivate = true })
	e.startJobs(webhook.Config{AllowPrivate: true, MaxAttempts: 2})
	hook := newHookServer(t, 100)
	rec := e.finish("w2", with(input("hi"), "webhook", hook.URL))
	got := awaitWebhook(t, e, "w2", rec.RunID, protocol.WebhookFailed)
	if got.Webhook.Attempts != 2 || !strings.Contains(got.Webhook.LastError, "500") {
		t.Fatalf("webhook state %+v", got.Webhook)
	}
}

// By default a webhook to loopback is refused at submission, and a
// delivery never connects to a private address even when the submitting
// gateway let it through (a name that resolves elsewhere by then).
func TestWebhookRefusesPrivateAddresses(t *testing.T) {
	e := newEnv(t, echoModel())
	hook := newHookServer(t, 0)
	for _, u := range []string{hook.URL, "http://localhost:9/x", "http://[::1]/x", "http://169.254.169.254/latest/meta-data", "http://10.1.2.3/x"} {
		if err := e.do("POST", "/threads/w3/runs", with(input("hi"), "webhook", u)).expect(t, http.StatusBadRequest).apiError(t); err.Field != "webhook" {
			t.Errorf("%s: %+v", u, err)
		}
	}

	e2 := newEnvWith(t, echoModel(), func(s *Server) { s.cfg.WebhookAllowPrivate = true })
	e2.startJobs(webhook.Config{MaxAttempts: 3}) // the workers do not allow private addresses
	rec := e2.finish("w4", with(input("hi"), "webhook", hook.URL))
	got := awaitWebhook(t, e2, "w4", rec.RunID, protocol.WebhookFailed)
	if got.Webhook.Attempts != 1 || !strings.Contains(got.Webhook.LastError, "not a public address") {
		t.Fatalf("webhook state %+v", got.Webhook)
	}
	if n := len(hook.deliveries()); n != 0 {
		t.Fatalf("%d deliveries reached a loopback receiver", n)
	}
}
