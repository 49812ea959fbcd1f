package gateway

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
	"github.com/natsagent/natsagent/internal/worker"
)

func TestSystemAssistantID(t *testing.T) {
	// What LangGraph's server (and Aegra) derive for graph "agent":
	// uuid5(6ba7b821-9dad-11d1-80b4-00c04fd430c8, "agent").
	if got := systemAssistantID("agent"); got != "fe096781-5601-53d2-b2f6-0d3403f7e9ca" {
		t.Fatalf("system assistant id of agent: %s", got)
	}
	if systemAssistantID("chatbot") == systemAssistantID("coder") {
		t.Fatal("two graphs share an id")
	}
}

func TestAssistantsSystemAndCRUD(t *testing.T) {
	e := newEnvWith(t, nil, func(s *Server) {
		s.cfg.Graphs = []Graph{{Name: "chatbot", Description: "talks"}, {Name: "coder"}}
	})
	// The graphs are system assistants, found by id and by graph name.
	var found []assistantView
	e.do("POST", "/assistants/search", map[string]any{}).expect(t, http.StatusOK).decode(t, fresh(&found))
	if len(found) != 2 {
		t.Fatalf("search without assistants: %+v", found)
	}
	var sys assistantView
	e.do("GET", "/assistants/chatbot", nil).expect(t, http.StatusOK).decode(t, &sys)
	if sys.AssistantID != systemAssistantID("chatbot") || sys.GraphID != "chatbot" || sys.Version != 1 || sys.Description == nil || *sys.Description != "talks" {
		t.Fatalf("system assistant %+v", sys)
	}
	e.do("GET", "/assistants/"+sys.AssistantID, nil).expect(t, http.StatusOK)
	e.do("PATCH", "/assistants/"+sys.AssistantID, map[string]any{"name": "x"}).expect(t, http.StatusForbidden)
	e.do("DELETE", "/assistants/chatbot", nil).expect(t, http.StatusForbidden)
	e.do("GET", "/assistants/nope", nil).expect(t, http.StatusNotFound)

	// Create: the graph must exist; config keys are a run's settings.
	if er := e.do("POST", "/assistants", map[string]any{"graph_id": "nope"}).expect(t, http.StatusBadRequest).apiError(t); er.Field != "graph_id" {
		t.Fatalf("unknown graph: %+v", er)
	}
	for _, c := range []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{"graph_id": "coder", "config": map[string]any{"system_prompt": "x"}}, "config.system_prompt"},
		{map[string]any{"graph_id": "coder", "config": map[string]any{"configurable": map[string]any{"temperature": 1}}}, "config.configurable.temperature"},
		{map[string]any{"graph_id": "coder", "context": map[string]any{"tools": []string{"a"}}}, "context.tools"},
		{map[string]any{"graph_id": "coder", "context": map[string]any{"user_id": "bob"}}, "config.user_id"},
		{map[string]any{"graph_id": "coder", "context": map[string]any{"max_steps": -1}}, "config.max_steps"},
		{map[string]any{"graph_id": "coder", "assistant_id": "a.b"}, "assistant_id"},
	} {
		if er := e.do("POST", "/assistants", c.body).expect(t, http.StatusBadRequest).apiError(t); er.Field != c.field {
			t.Fatalf("%v: field %q, want %q (%s)", c.body, er.Field, c.field, er.Message)
		}
	}
	var a assistantView
	e.do("POST", "/assistants", map[string]any{"graph_id": "coder", "name": "Reviewer", "description": "reviews",
		"config": map[string]any{"configurable": map[string]any{"model": "big"}}, "context": map[string]any{"max_steps": 7},
		"metadata": map[string]any{"team": "red"}}).expect(t, http.StatusOK).decode(t, &a)
	if a.AssistantID == "" || a.GraphID != "coder" || a.Version != 1 || a.Name != "Reviewer" || a.Metadata["team"] != "red" ||
		!strings.Contains(string(a.Config), `"big"`) || !strings.Contains(string(a.Context), `7`) {
		t.Fatalf("created %+v", a)
	}
	e.do("POST", "/assistants", map[string]any{"graph_id": "coder", "assistant_id": a.AssistantID}).expect(t, http.StatusConflict)
	var same assistantView
	e.do("POST", "/assistants", map[string]any{"graph_id": "coder", "assistant_id": a.AssistantID, "if_exists": "do_nothing"}).
		expect(t, http.StatusOK).decode(t, &same)
	if same.Name != "Reviewer" {
		t.Fatalf("do_nothing %+v", same)
	}
	e.do("POST", "/assistants", map[string]any{"graph_id": "coder", "assistant_id": systemAssistantID("coder")}).expect(t, http.StatusConflict)

	// Patch: a new version; metadata merged.
	var v2 assistantView
	e.do("PATCH", "/assistants/"+a.AssistantID, map[string]any{"name": "Reviewer 2", "metadata": map[string]any{"tier": "gold"}}).
		expect(t, http.StatusOK).decode(t, &v2)
	if v2.Version != 2 || v2.Name != "Reviewer 2" || v2.Metadata["team"] != "red" || v2.Metadata["tier"] != "gold" || !strings.Contains(string(v2.Config), "big") {
		t.Fatalf("patched %+v", v2)
	}
	e.do("PATCH", "/assistants/"+a.AssistantID, map[string]any{"config": map[string]any{"recursion_limit": 3}}).expect(t, http.StatusBadRequest)
	var versions []assistantView
	e.do("POST", "/assistants/"+a.AssistantID+"/versions", map[string]any{}).expect(t, http.StatusOK).decode(t, &versions)
	if len(versions) != 2 || versions[0].Version != 2 || versions[1].Version != 1 || versions[1].Name != "Reviewer" {
		t.Fatalf("versions %+v", versions)
	}
	e.do("POST", "/assistants/"+a.AssistantID+"/versions", map[string]any{"metadata": map[string]any{"tier": "gold"}}).expect(t, http.StatusOK).decode(t, &versions)
	if len(versions) != 1 || versions[0].Version != 2 {
		t.Fatalf("versions by metadata %+v", versions)
	}
	// Set latest: version 1 is current again; a later patch is version 3.
	var back assistantView
	e.do("POST", "/assistants/"+a.AssistantID+"/latest", map[string]any{"version": 1}).expect(t, http.StatusOK).decode(t, &back)
	if back.Version != 1 || back.Name != "Reviewer" {
		t.Fatalf("latest 1: %+v", back)
	}
	e.do("POST", "/assistants/"+a.AssistantID+"/latest", map[string]any{"version": 9}).expect(t, http.StatusNotFound)
	var got assistantView
	e.do("GET", "/assistants/"+a.AssistantID, nil).expect(t, http.StatusOK).decode(t, &got)
	if got.Version != 1 {
		t.Fatalf("get after latest %+v", got)
	}
	var v3 assistantView
	e.do("PATCH", "/assistants/"+a.AssistantID, map[string]any{"description": "three"}).expect(t, http.StatusOK).decode(t, &v3)
	if v3.Version != 3 || v3.Name != "Reviewer" {
		t.Fatalf("patch after latest %+v", v3)
	}

	// Search and count: filters, sort, select, pagination.
	var b assistantView
	e.do("POST", "/assistants", map[string]any{"graph_id": "chatbot", "name": "Helper"}).expect(t, http.StatusOK).decode(t, &b)
	e.do("POST", "/assistants/search", map[string]any{"graph_id": "coder"}).expect(t, http.StatusOK).decode(t, fresh(&found))
	if len(found) != 2 {
		t.Fatalf("search by graph %+v", found)
	}
	e.do("POST", "/assistants/search", map[string]any{"metadata": map[string]any{"team": "red"}}).expect(t, http.StatusOK).decode(t, fresh(&found))
	if len(found) != 1 || found[0].AssistantID != a.AssistantID {
		t.Fatalf("search by metadata %+v", found)
	}
	e.do("POST", "/assistants/search", map[string]any{"sort_by": "name", "sort_order": "asc", "limit": 2, "offset": 1}).expect(t, http.StatusOK).decode(t, fresh(&found))
	// Names sort bytewise: Helper, Reviewer, chatbot, coder.
	if len(found) != 2 || found[0].Name != "Reviewer" || found[1].Name != "chatbot" {
		t.Fatalf("sorted page %+v", found)
	}
	var sel []map[string]any
	e.do("POST", "/assistants/search", map[string]any{"select": []string{"assistant_id", "name"}, "name": "help"}).expect(t, http.StatusOK).decode(t, &sel)
	if len(sel) != 1 || len(sel[0]) != 2 || sel[0]["name"] != "Helper" {
		t.Fatalf("select %+v", sel)
	}
	e.do("POST", "/assistants/search", map[string]any{"select": []string{"secret"}}).expect(t, http.StatusBadRequest)
	e.do("POST", "/assistants/search", map[string]any{"sort_by": "tenant"}).expect(t, http.StatusBadRequest)
	var n int
	e.do("POST", "/assistants/count", map[string]any{}).expect(t, http.StatusOK).decode(t, &n)
	if n != 4 {
		t.Fatalf("count %d", n)
	}
	e.do("POST", "/assistants/count", map[string]any{"graph_id": "chatbot"}).expect(t, http.StatusOK).decode(t, &n)
	if n != 2 {
		t.Fatalf("count by graph %d", n)
	}

	// Schemas and graph.
	var schemas struct {
		GraphID       string         `json:"graph_id"`
		InputSchema   map[string]any `json:"input_schema"`
		ContextSchema map[string]any `json:"context_schema"`
	}
	e.do("GET", "/assistants/"+a.AssistantID+"/schemas", nil).expect(t, http.StatusOK).decode(t, &schemas)
	props, _ := schemas.ContextSchema["properties"].(map[string]any)
	inProps, _ := schemas.InputSchema["properties"].(map[string]any)
	if _, ok := props["max_steps"]; !ok || props["user_id"] != nil || inProps["messages"] == nil || schemas.GraphID != "coder" {
		t.Fatalf("schemas %+v", schemas)
	}
	var g struct {
		Nodes []struct{ ID string } `json:"nodes"`
		Edges []struct{ Source, Target string }
	}
	e.do("GET", "/assistants/"+a.AssistantID+"/graph", nil).expect(t, http.StatusOK).decode(t, &g)
	if len(g.Nodes) != 4 || g.Nodes[1].ID != "model" || len(g.Edges) == 0 {
		t.Fatalf("graph %+v", g)
	}
	e.do("GET", "/assistants/"+a.AssistantID+"/subgraphs", nil).expect(t, http.StatusOK)

	// Delete: gone with its versions.
	e.do("DELETE", "/assistants/"+a.AssistantID+"?delete_threads=true", nil).expect(t, http.StatusBadRequest)
	e.do("DELETE", "/assistants/"+a.AssistantID, nil).expect(t, http.StatusNoContent)
	e.do("GET", "/assistants/"+a.AssistantID, nil).expect(t, http.StatusNotFound)
	e.do("POST", "/assistants/"+a.AssistantID+"/versions", nil).expect(t, http.StatusNotFound)
	if vs, err := e.gw.assistants.Versions(context.Background(), protocol.DefaultTenant, a.AssistantID); err != nil || len(vs) != 0 {
		t.Fatalf("versions left after delete: %d %v", len(vs), err)
	}
}

func TestAssistantsTenantIsolation(t *testing.T) {
	e := newEnv(t, nil)
	var a assistantView
	e.do("POST", "/assistants", map[string]any{"graph_id": "chatbot", "name": "mine"}, "X-Tenant", "t1").expect(t, http.StatusOK).decode(t, &a)
	var found []assistantView
	e.do("POST", "/assistants/search", map[string]any{}, "X-Tenant", "t2").expect(t, http.StatusOK).decode(t, fresh(&found))
	if len(found) != 1 || found[0].AssistantID != systemAssistantID("chatbot") {
		t.Fatalf("t2 sees %+v", found)
	}
	var n int
	e.do("POST", "/assistants/count", nil, "X-Tenant", "t2").expect(t, http.StatusOK).decode(t, &n)
	if n != 1 {
		t.Fatalf("t2 counts %d", n)
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/assistants/" + a.AssistantID}, {"PATCH", "/assistants/" + a.AssistantID}, {"DELETE", "/assistants/" + a.AssistantID},
		{"POST", "/assistants/" + a.AssistantID + "/versions"}, {"POST", "/assistants/" + a.AssistantID + "/latest"},
		{"GET", "/assistants/" + a.AssistantID + "/schemas"},
	} {
		body := map[string]any{"version": 1}
		if r := e.do(c.method, c.path, body, "X-Tenant", "t2"); r.status != http.StatusNotFound {
			t.Fatalf("t2 %s %s: %d %s", c.method, c.path, r.status, r.body)
		}
	}
	// A run of t2 naming t1's assistant does not get its graph or config:
	// the id is an unknown agent to t2.
	e.do("GET", "/assistants/"+a.AssistantID, nil, "X-Tenant", "t1").expect(t, http.StatusOK)
}

func TestAssistantsPolicy(t *testing.T) {
	p := newPolicyEnv(t)
	p.gw.cfg.Graphs = []Graph{{Name: "chatbot"}, {Name: "coder"}}
	alice, bob, ops := []string{"X-API-Key", aliceKey}, []string{"X-API-Key", bobKey}, []string{"X-API-Key", opsKey}
	// Creating needs the right to run the graph with those settings.
	if er := p.do("POST", "/assistants", map[string]any{"graph_id": "coder"}, alice...).expect(t, http.StatusForbidden).apiError(t); !strings.Contains(er.Message, "coder") {
		t.Fatalf("member on coder: %+v", er)
	}
	p.do("POST", "/assistants", map[string]any{"graph_id": "chatbot", "context": map[string]any{"tool_approval_mode": "always_trust"}}, alice...).expect(t, http.StatusForbidden)
	var a assistantView
	p.do("POST", "/assistants", map[string]any{"graph_id": "chatbot", "name": "alice's"}, alice...).expect(t, http.StatusOK).decode(t, &a)
	// Everyone of the tenant sees it; only its creator or an admin changes it.
	p.do("GET", "/assistants/"+a.AssistantID, nil, bob...).expect(t, http.StatusOK)
	p.do("PATCH", "/assistants/"+a.AssistantID, map[string]any{"name": "bob's"}, bob...).expect(t, http.StatusForbidden)
	p.do("DELETE", "/assistants/"+a.AssistantID, nil, bob...).expect(t, http.StatusForbidden)
	p.do("POST", "/assistants/"+a.AssistantID+"/latest", map[string]any{"version": 1}, bob...).expect(t, http.StatusForbidden)
	p.do("PATCH", "/assistants/"+a.AssistantID, map[string]any{"name": "renamed"}, alice...).expect(t, http.StatusOK)
	p.do("DELETE", "/assistants/"+a.AssistantID, nil, ops...).expect(t, http.StatusNoContent)
}

// TestRunWithAssistantConfig: a run naming an assistant runs its graph
// with its config under the run's own.
func TestRunWithAssistantConfig(t *testing.T) {
	var mu sync.Mutex
	var models []string
	llm := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		mu.Lock()
		models = append(models, req.Model)
		mu.Unlock()
		return openaitest.Text("ok")
	})
	e := newEnv(t, nil)
	m, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: llm.URL(), Model: "base"})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(e.srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	agents, err := agent.NewAgents(m, tools.NewRegistry(), agent.Chatbot())
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
	t.Cleanup(func() { cancel(); natstest.Recv(t, done, "the worker to stop") })

	var a assistantView
	e.do("POST", "/assistants", map[string]any{"graph_id": "chatbot", "context": map[string]any{"model": "from-assistant"}}).
		expect(t, http.StatusOK).decode(t, &a)
	wait := func(thread string, body map[string]any) {
		t.Helper()
		e.do("POST", "/threads/"+thread+"/runs/wait", body).expect(t, http.StatusOK)
		var runs []protocol.Run
		e.do("GET", "/threads/"+thread+"/runs", nil).expect(t, http.StatusOK).decode(t, &runs)
		if len(runs) != 1 || runs[0].Agent != "chatbot" || runs[0].Status != protocol.StatusSuccess {
			t.Fatalf("runs %+v", runs)
		}
	}
	wait("r1", with(input("hi"), "assistant_id", a.AssistantID))
	wait("r2", with(input("hi"), "assistant_id", a.AssistantID, "config", map[string]any{"model": "from-run"}))
	wait("r3", with(input("hi"), "assistant_id", systemAssistantID("chatbot")))
	mu.Lock()
	defer mu.Unlock()
	if len(models) != 3 || models[0] != "from-assistant" || models[1] != "from-run" || models[2] != "base" {
		t.Fatalf("models asked for: %v", models)
	}
}

// fresh empties *p before a decode: json.Unmarshal into a used slice
// merges maps into its old elements.
func fresh[T any](p *[]T) *[]T {
	*p = nil
	return p
}

func TestEraseUserDeletesAssistants(t *testing.T) {
	p := newPolicyEnv(t)
	alice, ops := []string{"X-API-Key", aliceKey}, []string{"X-API-Key", opsKey}
	var a, o assistantView
	p.do("POST", "/assistants", map[string]any{"graph_id": "chatbot"}, alice...).expect(t, http.StatusOK).decode(t, &a)
	p.do("POST", "/assistants", map[string]any{"graph_id": "chatbot"}, ops...).expect(t, http.StatusOK).decode(t, &o)
	p.do("DELETE", "/users/alice", nil, ops...).expect(t, http.StatusOK)
	p.do("GET", "/assistants/"+a.AssistantID, nil, ops...).expect(t, http.StatusNotFound)
	p.do("GET", "/assistants/"+o.AssistantID, nil, ops...).expect(t, http.StatusOK)
}
