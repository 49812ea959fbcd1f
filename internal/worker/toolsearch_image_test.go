package worker

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
)

// withProfile makes the worker's chatbot use the given model name and
// middleware settings, and gives every thread the workdir wd.
func (h *harness) withProfile(m model.Model, modelName string, settings map[string]json.RawMessage, wd files.Workdir) func(*Config) {
	return func(c *Config) {
		chatbot := agent.Chatbot()
		chatbot.Tools = h.tools.Names()
		chatbot.Model = modelName
		chatbot.Middleware.Settings = settings
		agents, err := agent.NewAgents(m, h.tools, chatbot)
		if err != nil {
			h.t.Fatal(err)
		}
		c.Agents = agents
		if wd != nil {
			c.Files = func(string, string) files.Workdir { return wd }
		}
	}
}

func offers(req *openaitest.Request, name string) bool {
	for _, t := range req.Tools {
		if t.Function.Name == name {
			return true
		}
	}
	return false
}

// A deferred tool promoted by tool_search in one run is offered in the
// thread's next run without a new search: the promotion is thread state,
// checkpointed in KV and loaded by whichever worker runs the next run.
func TestToolSearchPromotionSurvivesRuns(t *testing.T) {
	h := newHarness(t)
	var issues recordingTool
	issues.register(h, "github__create_issue")
	var mu sync.Mutex
	offeredFirst := map[string]bool{} // user text → deferred tool offered in the run's first request
	srv, m := strictModel(t, func(req *openaitest.Request) openaitest.Reply {
		last := req.LastMessage()
		switch {
		case last.Role == "user":
			// Middlewares may add to the person's text in the request.
			first := strings.HasPrefix(last.Content, "file an issue")
			key := "another one"
			if first {
				key = "file an issue"
			}
			mu.Lock()
			offeredFirst[key] = offers(req, "github__create_issue")
			mu.Unlock()
			if first {
				return openaitest.Reply{ToolCalls: []openaitest.Call{{ID: "s1", Name: middleware.ToolSearchTool, Arguments: `{"query":"select:github__create_issue"}`}}}
			}
			return openaitest.Reply{ToolCalls: []openaitest.Call{{ID: "i2", Name: "github__create_issue", Arguments: `{"title":"second"}`}}}
		case last.Role == "tool" && last.Name == middleware.ToolSearchTool:
			return openaitest.Reply{ToolCalls: []openaitest.Call{{ID: "i1", Name: "github__create_issue", Arguments: `{"title":"first"}`}}}
		default:
			return openaitest.Text("filed")
		}
	})
	h.startWorker(m, h.withProfile(m, "", map[string]json.RawMessage{"tool_search": json.RawMessage(`{"enabled": true}`)}, nil))

	for _, run := range []struct{ id, text string }{{"r1", "file an issue"}, {"r2", "another one"}} {
		w := h.watch("default", "ts", run.id)
		h.submit(request("ts", run.id, run.text))
		if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess {
			t.Fatalf("run %s ended %s: %s", run.id, fin.Status, fin.Error)
		}
	}
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("invalid requests: %v", v)
	}
	mu.Lock()
	defer mu.Unlock()
	if offeredFirst["file an issue"] {
		t.Fatal("the deferred tool was offered before any search")
	}
	if !offeredFirst["another one"] {
		t.Fatal("the second run was not offered the tool promoted in the first")
	}
	if got := issues.calls(); len(got) != 2 {
		t.Fatalf("github__create_issue ran %v", got)
	}
}

// view_image on a vision model: the provider receives the image as an
// image_url part with a data URL, and nothing stored for the thread (its
// checkpoints in KV, its run records, its events) holds the payload
// (deer-flow #4138).
func TestViewImageNotInCheckpoints(t *testing.T) {
	h := newHarness(t)
	wd := files.NewMemory()
	img := append([]byte("\x89PNG\r\n\x1a\n"), bytes.Repeat([]byte("pixels!"), 64)...)
	if err := wd.Write(context.Background(), "/uploads/chart.png", img); err != nil {
		t.Fatal(err)
	}
	payload := base64.StdEncoding.EncodeToString(img)
	var sawImage bool
	srv, m := strictModel(t, func(req *openaitest.Request) openaitest.Reply {
		last := req.LastMessage()
		if last.Role == "user" && strings.HasPrefix(last.Content, "describe the chart") {
			return openaitest.Reply{ToolCalls: []openaitest.Call{{ID: "v1", Name: middleware.ViewImageTool, Arguments: `{"path":"/uploads/chart.png"}`}}}
		}
		for _, p := range last.Parts {
			if p.ImageURL != nil && p.ImageURL.URL == "data:image/png;base64,"+payload {
				sawImage = true
			}
		}
		return openaitest.Text("a chart")
	})
	h.startWorker(m, h.withProfile(m, "gpt-4o", map[string]json.RawMessage{"view_image": json.RawMessage(`{"enabled": true}`)}, wd))

	w := h.watch("default", "vi", "r1")
	h.submit(request("vi", "r1", "describe the chart"))
	if fin := w.finished(t, 10*time.Second); fin.Status != protocol.StatusSuccess || fin.Output.Content != "a chart" {
		t.Fatalf("run ended %s: %s", fin.Status, fin.Error)
	}
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("invalid requests: %v", v)
	}
	if !sawImage {
		t.Fatal("the provider never received the image")
	}

	ctx := context.Background()
	stored := 0
	for _, bucket := range []string{h.names.CheckpointsBucket(), h.names.ThreadsBucket(), h.names.RunsBucket()} {
		kv, err := h.js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for key := range keys.Keys() {
			e, err := kv.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			stored++
			if v := e.Value(); bytes.Contains(v, []byte(payload[:40])) || bytes.Contains(v, []byte("data:image")) {
				t.Fatalf("%s/%s holds the image payload", bucket, key)
			}
		}
	}
	if stored < 3 {
		t.Fatalf("only %d stored values read", stored)
	}
	for _, ev := range w.all() {
		if strings.Contains(string(ev.Data), payload[:40]) {
			t.Fatalf("event %s holds the image payload", ev.Type)
		}
	}
	// The state holds the metadata.
	var found bool
	for _, msg := range h.threadState("default", "vi") {
		if msg.Role == model.RoleTool && msg.ToolCallID == "v1" {
			found = strings.Contains(msg.Content, "/uploads/chart.png (image/png")
		}
		if len(msg.Parts) > 0 {
			t.Fatalf("stored message with parts: %+v", msg)
		}
	}
	if !found {
		t.Fatal("no view_image result in the thread")
	}
}
