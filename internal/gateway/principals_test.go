package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/memory"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/policy"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
	"github.com/natsagent/natsagent/internal/worker"
)

const (
	aliceKey = "alice-0123456789-secret-key"
	bobKey   = "bob-0123456789-secret-key-x"
	opsKey   = "ops-0123456789-secret-key-xx"
)

// policyEnv is a gateway with three API keys of tenant acme (alice, a
// member; bob, a viewer; ops, an admin) and a worker whose chatbot has
// memory, calling the OpenAI-compatible test server.
type policyEnv struct {
	*env
	llm   *openaitest.Server
	store *memory.Store
}

func newPolicyEnv(t *testing.T) *policyEnv {
	t.Helper()
	pol, err := policy.New(config.Policy{
		DefaultRoles: []string{"member"},
		Roles: map[string]config.Role{
			"member": {Agents: []string{"chatbot"}, Tools: config.ToolRule{Allow: []string{"*"}, Deny: []string{"current_time"}}},
			"viewer": {Agents: []string{"chatbot"}, Tools: config.ToolRule{Allow: []string{"read_*"}}},
			"admin":  {Agents: []string{"*"}, Tools: config.ToolRule{Allow: []string{"*"}}, AlwaysTrust: true, ActForOthers: true, ReadAllThreads: true, EraseUsers: true},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, nil, func(s *Server) {
		a, err := newAuthenticator([]APIKey{
			{Name: "alice", Tenant: "acme", SHA256: sha256.Sum256([]byte(aliceKey))}, // default roles
			{Name: "bob-app", User: "bob", Roles: []string{"viewer"}, Tenant: "acme", SHA256: sha256.Sum256([]byte(bobKey))},
			{Name: "ops", Roles: []string{"admin"}, Tenant: "acme", SHA256: sha256.Sum256([]byte(opsKey))},
		})
		if err != nil {
			t.Fatal(err)
		}
		s.auth, s.cfg.Policy = a, pol
	})
	store, err := memory.Open(context.Background(), e.js, memory.Config{Names: e.settings.Names})
	if err != nil {
		t.Fatal(err)
	}
	llm := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		last := req.LastMessage()
		switch {
		case last.Role == model.RoleTool:
			return openaitest.Text("Noted: " + last.Content)
		case strings.Contains(last.Content, "remember that"):
			return openaitest.ToolCall(middleware.RememberTool, `{"note":"Lives in Lyon"}`)
		case strings.Contains(last.Content, "what time"):
			return openaitest.ToolCall("current_time", `{}`)
		}
		return openaitest.Text("ok")
	})
	m, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: llm.URL(), Model: "test"})
	if err != nil {
		t.Fatal(err)
	}
	chatbot := agent.Chatbot()
	chatbot.Middleware.Settings = map[string]json.RawMessage{"memory": json.RawMessage(`{"enabled": true}`)}
	coder := agent.Chatbot()
	coder.Name = "coder"
	agents, err := agent.NewAgentsWith(agent.Resources{Model: m, Tools: tools.NewRegistry(), Memory: store, ToolPolicy: pol.ToolFilter}, chatbot, coder)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(e.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	w, err := worker.New(context.Background(), nc, worker.Config{Settings: e.settings, Concurrency: 2, Agents: agents,
		Logger: zaptest.NewLogger(t), ShutdownGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		natstest.Recv(t, done, "the worker to stop")
		nc.Close()
	})
	return &policyEnv{env: e, llm: llm, store: store}
}

func bearer(key string) []string { return []string{"Authorization", "Bearer " + key} }

// sent returns the model request whose last user message is text.
func (e *policyEnv) sent(text string) *openaitest.Request {
	e.t.Helper()
	for _, r := range e.llm.Requests() {
		for _, m := range r.Messages {
			if m.Role == model.RoleUser && m.Content == text {
				return &r
			}
		}
	}
	e.t.Fatalf("no model request carried %q", text)
	return nil
}

func toolNames(r *openaitest.Request) []string {
	var out []string
	for _, t := range r.Tools {
		out = append(out, t.Function.Name)
	}
	return out
}

func TestPolicyRefusesRunCreation(t *testing.T) {
	e := newPolicyEnv(t)
	for _, c := range []struct {
		name, thread string
		body         map[string]any
		want         string
	}{
		{"always_trust", "f1", with(input("hi"), "config", map[string]any{"tool_approval_mode": "always_trust"}),
			"role member may not choose tool_approval_mode always_trust: policy.roles.member.always_trust"},
		{"always_trust, LangGraph style", "f2", with(input("hi"), "config", map[string]any{"configurable": map[string]any{"tool_approval_mode": "always_trust"}}),
			"policy.roles.member.always_trust"},
		{"another agent", "f3", with(input("hi"), "assistant_id", "coder"),
			"role member may not run agent coder: policy.roles.member.agents"},
		{"another user", "f4", with(input("hi"), "config", map[string]any{"user_id": "bob"}),
			"role member may not act for user bob (config.user_id); leave config.user_id out to act as alice: policy.roles.member.act_for_others"},
		{"another user, LangGraph style", "f5", with(input("hi"), "config", map[string]any{"configurable": map[string]any{"user_id": "bob"}}),
			"policy.roles.member.act_for_others"},
	} {
		r := e.do("POST", "/threads/"+c.thread+"/runs/wait?format=natsagent", c.body, bearer(aliceKey)...).expect(t, http.StatusForbidden)
		if er := r.apiError(t); er.Code != CodeForbidden || !strings.Contains(er.Message, c.want) {
			t.Errorf("%s: %+v, want %q", c.name, er, c.want)
		}
		if _, _, err := e.stores.Threads.Get(context.Background(), "acme", c.thread); !errors.Is(err, kv.ErrNotFound) {
			t.Errorf("%s: a refused run created its thread: %v", c.name, err)
		}
	}
	// The same requests from an admin run, acting for alice.
	rec := e.do("POST", "/threads/f6/runs/wait?format=natsagent", with(input("hi"), "assistant_id", "coder",
		"config", map[string]any{"tool_approval_mode": "always_trust", "user_id": "alice"}), bearer(opsKey)...).expect(t, http.StatusOK).run(t)
	if rec.Status != protocol.StatusSuccess {
		t.Fatalf("admin's run %s: %s", rec.Status, rec.Error)
	}
	// alice naming herself is no acting for others.
	e.do("POST", "/threads/f7/runs/wait?format=natsagent", with(input("hi"), "config", map[string]any{"user_id": "alice"}), bearer(aliceKey)...).expect(t, http.StatusOK)
}

// TestMemoryIsolatedByPrincipal: memory is keyed by user, and the user is
// the principal's: bob never reads alice's notes, whatever his body says.
func TestMemoryIsolatedByPrincipal(t *testing.T) {
	e := newPolicyEnv(t)
	ctx := context.Background()
	rec := e.do("POST", "/threads/a1/runs/wait?format=natsagent", input("Please remember that I live in Lyon."), bearer(aliceKey)...).expect(t, http.StatusOK).run(t)
	if rec.Status != protocol.StatusSuccess {
		t.Fatalf("alice's run %s: %s", rec.Status, rec.Error)
	}
	if notes, _ := e.store.Notes(ctx, "acme", "alice"); notes != "- Lives in Lyon" {
		t.Fatalf("alice's notes %q", notes)
	}

	e.do("POST", "/threads/b1/runs/wait?format=natsagent", with(input("Where do I live? (bob)"), "config", map[string]any{"user_id": "alice"}), bearer(bobKey)...).
		expect(t, http.StatusForbidden)
	rec = e.do("POST", "/threads/b1/runs/wait?format=natsagent", input("Where do I live? (bob)"), bearer(bobKey)...).expect(t, http.StatusOK).run(t)
	if rec.Status != protocol.StatusSuccess {
		t.Fatalf("bob's run %s: %s", rec.Status, rec.Error)
	}
	if sys := e.sent("Where do I live? (bob)").Messages[0].Content; strings.Contains(sys, "Lyon") {
		t.Fatalf("bob's run reads alice's memory:\n%s", sys)
	}
	if notes, _ := e.store.Notes(ctx, "acme", "bob"); notes != "" {
		t.Fatalf("bob has notes %q", notes)
	}

	// An admin acting for alice reads hers: acting for others works.
	e.do("POST", "/threads/o1/runs/wait?format=natsagent", with(input("Where does she live? (ops)"), "config", map[string]any{"user_id": "alice"}), bearer(opsKey)...).
		expect(t, http.StatusOK)
	if sys := e.sent("Where does she live? (ops)").Messages[0].Content; !strings.Contains(sys, "- Lives in Lyon") {
		t.Fatalf("the admin's run for alice lacks her memory:\n%s", sys)
	}
}

// TestToolPolicyTrimsTheModelsTools: what the provider is offered is what
// the principal's roles allow, including the middlewares' own tools, and
// a call to a tool not offered is refused.
func TestToolPolicyTrimsTheModelsTools(t *testing.T) {
	e := newPolicyEnv(t)
	e.do("POST", "/threads/t1/runs/wait?format=natsagent", input("hello (alice)"), bearer(aliceKey)...).expect(t, http.StatusOK)
	e.do("POST", "/threads/t2/runs/wait?format=natsagent", input("hello (bob)"), bearer(bobKey)...).expect(t, http.StatusOK)
	e.do("POST", "/threads/t3/runs/wait?format=natsagent", input("hello (ops)"), bearer(opsKey)...).expect(t, http.StatusOK)

	alice, bob, ops := toolNames(e.sent("hello (alice)")), toolNames(e.sent("hello (bob)")), toolNames(e.sent("hello (ops)"))
	if slices.Contains(alice, "current_time") || !slices.Contains(alice, "read_file") || !slices.Contains(alice, middleware.RememberTool) {
		t.Errorf("member (all but current_time) is offered %v", alice)
	}
	for _, n := range bob {
		if !strings.HasPrefix(n, "read_") {
			t.Errorf("viewer (read_* only) is offered %s: %v", n, bob)
		}
	}
	if !slices.Contains(bob, "read_file") {
		t.Errorf("viewer is not offered read_file: %v", bob)
	}
	if !slices.Contains(ops, "current_time") || !slices.Contains(ops, middleware.RememberTool) {
		t.Errorf("admin (every tool) is offered %v", ops)
	}

	// The model calls current_time anyway: alice's run gets a refusal.
	e.do("POST", "/threads/t4/runs/wait?format=natsagent", input("what time is it? (alice)"), bearer(aliceKey)...).expect(t, http.StatusOK)
	var result string
	for _, r := range e.llm.Requests() {
		if last := r.LastMessage(); last.Role == model.RoleTool && slices.ContainsFunc(r.Messages, func(m openaitest.Message) bool { return m.Content == "what time is it? (alice)" }) {
			result = last.Content
		}
	}
	if !strings.Contains(result, "the tool current_time is not available to this run") {
		t.Fatalf("current_time result for alice: %q", result)
	}
}

// TestThreadsAreOwned: a thread belongs to the user who created it;
// another user of the tenant finds none of it, as if it were another
// tenant's, unless a role reads all threads.
func TestThreadsAreOwned(t *testing.T) {
	e := newPolicyEnv(t)
	ctx := context.Background()
	rec := e.do("POST", "/threads/a1/runs/wait?format=natsagent", input("hello"), bearer(aliceKey)...).expect(t, http.StatusOK).run(t)
	e.do("POST", "/threads", map[string]any{"thread_id": "a2"}, bearer(aliceKey)...).expect(t, http.StatusOK)
	for _, id := range []string{"a1", "a2"} {
		th, _, err := e.stores.Threads.Get(ctx, "acme", id)
		if err != nil || th.Owner != "alice" {
			t.Fatalf("thread %s: %+v %v", id, th, err)
		}
	}

	run := "/threads/a1/runs/" + rec.RunID
	for _, c := range []struct{ method, path string }{
		{"GET", "/threads/a1"}, {"GET", "/threads/a1/state"}, {"GET", "/threads/a1/history"}, {"POST", "/threads/a1/history"},
		{"GET", "/threads/a1/runs"}, {"GET", run}, {"GET", run + "/stream"}, {"GET", run + "/join?format=natsagent"}, {"POST", run + "/cancel"},
		{"GET", run + "/usage"}, {"GET", "/threads/a1/usage"}, {"POST", "/threads/a1/compact"},
	} {
		r := e.do(c.method, c.path, nil, bearer(bobKey)...).expect(t, http.StatusNotFound)
		if er := r.apiError(t); strings.Contains(er.Message, "alice") {
			t.Errorf("%s %s tells the owner: %s", c.method, c.path, er.Message)
		}
		e.do(c.method, c.path, nil, bearer(opsKey)...) // an admin may; answered as the route answers
	}
	// Runs on it, whatever their strategy, are refused and never queued.
	for _, body := range []map[string]any{input("mine now"), with(input("steer"), "multitask_strategy", "steer"),
		{"command": map[string]any{"resume": "yes"}}} {
		e.do("POST", "/threads/a1/runs", body, bearer(bobKey)...).expect(t, http.StatusNotFound)
	}
	if ids, err := e.stores.Threads.RunIDs(ctx, "acme", "a1"); err != nil || len(ids) != 1 {
		t.Fatalf("runs of a1: %v %v", ids, err)
	}
	e.do("POST", "/threads", map[string]any{"thread_id": "a2", "if_exists": "do_nothing"}, bearer(bobKey)...).expect(t, http.StatusConflict)

	var list []map[string]any
	e.do("GET", "/threads", nil, bearer(bobKey)...).expect(t, http.StatusOK).decode(t, &list)
	if len(list) != 0 {
		t.Fatalf("bob lists %v", list)
	}
	e.do("GET", "/threads", nil, bearer(opsKey)...).expect(t, http.StatusOK).decode(t, &list)
	if len(list) != 2 {
		t.Fatalf("the admin lists %d threads", len(list))
	}
	e.do("GET", "/threads/a1/state", nil, bearer(opsKey)...).expect(t, http.StatusOK)
	e.do("GET", run, nil, bearer(aliceKey)...).expect(t, http.StatusOK)
}

// TestFirstRunOwnsANewThread: a run a trusted submitter other than the
// gateway queued (as the submit service for NATS clients does) makes its
// principal's user the owner of the thread it creates.
func TestFirstRunOwnsANewThread(t *testing.T) {
	e := newPolicyEnv(t)
	ctx := context.Background()
	req := &protocol.RunRequest{RunID: "n1", ThreadID: "n1", Tenant: "acme", Agent: protocol.DefaultAgent,
		Input:     &protocol.Input{Messages: []model.Message{{Role: model.RoleUser, Content: "from NATS"}}},
		Principal: &protocol.Principal{User: "carol"}}
	req.Normalize()
	data, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.gw.queue.Enqueue(ctx, req, data); err != nil {
		t.Fatal(err)
	}
	e.do("GET", "/threads/n1/runs/n1/join?format=natsagent", nil, bearer(opsKey)...).expect(t, http.StatusOK)
	th, _, err := e.stores.Threads.Get(ctx, "acme", "n1")
	if err != nil || th.Owner != "carol" {
		t.Fatalf("thread n1: %+v %v", th, err)
	}
	e.do("GET", "/threads/n1", nil, bearer(aliceKey)...).expect(t, http.StatusNotFound)
}

// TestRunSwitches: a run may turn clarification, subagents and plan mode
// off for itself, whoever asks; turning one on is refused (403) when the
// principal's roles do not offer its tool, and a value that is not a
// boolean is 400. What is off is neither offered to the model nor
// described in its prompt.
func TestRunSwitches(t *testing.T) {
	e := newPolicyEnv(t)
	for _, c := range []struct {
		name string
		body map[string]any
		want string
	}{
		{"viewer turns plan mode on", with(input("plan (bob)"), "config", map[string]any{"configurable": map[string]any{"plan_mode": true}}),
			"role viewer may not turn on config.plan_mode: its tools do not include write_todos"},
		{"viewer turns subagents on in context", with(input("delegate (bob)"), "context", map[string]any{"subagents": true}),
			"may not turn on config.subagents: its tools do not include task"},
		{"viewer turns clarification on", with(input("ask me (bob)"), "config", map[string]any{"clarification": true}),
			"may not turn on config.clarification: its tools do not include ask_clarification"},
	} {
		r := e.do("POST", "/threads/s1/runs/wait?format=natsagent", c.body, bearer(bobKey)...).expect(t, http.StatusForbidden)
		if er := r.apiError(t); er.Code != CodeForbidden || !strings.Contains(er.Message, c.want) {
			t.Errorf("%s: %+v, want %q", c.name, er, c.want)
		}
	}
	r := e.do("POST", "/threads/s2/runs/wait?format=natsagent", with(input("x"), "config", map[string]any{"configurable": map[string]any{"plan_mode": "yes"}}), bearer(aliceKey)...).
		expect(t, http.StatusBadRequest)
	if er := r.apiError(t); !strings.Contains(er.Message, "config.configurable.plan_mode") {
		t.Errorf("a string switch: %+v", er)
	}

	// Turning off is always allowed, and removes the tools and the guide.
	e.do("POST", "/threads/s3/runs/wait?format=natsagent", with(input("off (alice)"), "config",
		map[string]any{"configurable": map[string]any{"plan_mode": false, "clarification": false}, "subagents": false}), bearer(aliceKey)...).expect(t, http.StatusOK)
	e.do("POST", "/threads/s4/runs/wait?format=natsagent", with(input("on (alice)"), "context", map[string]any{"plan_mode": true, "clarification": true}), bearer(aliceKey)...).
		expect(t, http.StatusOK)
	e.do("POST", "/threads/s5/runs/wait?format=natsagent", with(input("off (bob)"), "config", map[string]any{"plan_mode": false}), bearer(bobKey)...).expect(t, http.StatusOK)
	off, on := e.sent("off (alice)"), e.sent("on (alice)")
	for _, tool := range []string{middleware.WriteTodosTool, middleware.ClarificationTool} {
		if slices.Contains(toolNames(off), tool) {
			t.Errorf("switched off, %s is offered: %v", tool, toolNames(off))
		}
		if !slices.Contains(toolNames(on), tool) {
			t.Errorf("switched on, %s is not offered: %v", tool, toolNames(on))
		}
	}
	if strings.Contains(off.Messages[0].Content, "write_todos") || !strings.Contains(on.Messages[0].Content, "write_todos") {
		t.Errorf("the todo guide follows plan_mode: off %q / on %q", off.Messages[0].Content, on.Messages[0].Content)
	}
}
