package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/sandbox"
	"github.com/natsagent/natsagent/internal/sandbox/sandboxtest"
	"github.com/natsagent/natsagent/internal/tools"
)

// A run whose model calls execute: the command runs in the sandbox on the
// thread's object store workdir, its output is the tool result in the
// thread's transcript, and the file it wrote is in the object store for
// any other worker or the gateway.
func TestExecuteEndToEnd(t *testing.T) {
	h := newHarness(t)
	h.tools.Register(tools.Execute(tools.ExecuteConfig{Sandbox: sandboxtest.New(t, sandbox.Config{}), Timeout: 10 * time.Second}))
	ctx := context.Background()
	store, err := h.js.ObjectStore(ctx, h.names.FilesBucket())
	if err != nil {
		t.Fatal(err)
	}
	index, err := h.js.KeyValue(ctx, h.names.ThreadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	workdir := func(tenant, thread string) files.Workdir { return files.NewObjectStore(store, index, tenant, thread) }
	if err := workdir("default", "ex").Write(ctx, "/uploads/data.csv", []byte("a\nb\nc\n")); err != nil {
		t.Fatal(err)
	}
	srv, m := strictModel(t, func(req *openaitest.Request) openaitest.Reply {
		last := req.LastMessage()
		if last.Role == "user" {
			return openaitest.Reply{ToolCalls: []openaitest.Call{{ID: "x1", Name: tools.ToolExecute,
				Arguments: `{"command":"id -u; mkdir -p out; wc -l < uploads/data.csv | tee out/count.txt","timeout_seconds":5}`}}}
		}
		return openaitest.Text("counted")
	})
	h.startWorker(m, func(c *Config) {
		h.withProfile(m, "", nil, nil)(c)
		c.Files = workdir
	})
	w := h.watch("default", "ex", "r1")
	req := request("ex", "r1", "count the rows")
	// execute asks a person by default; this run trusts its tools.
	req.Config.ToolApprovalMode = "always_trust"
	h.submit(req)
	if fin := w.finished(t, 20*time.Second); fin.Status != protocol.StatusSuccess || fin.Output.Content != "counted" {
		t.Fatalf("run ended %s: %s", fin.Status, fin.Error)
	}
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("invalid requests: %v", v)
	}
	var result string
	for _, msg := range h.threadState("default", "ex") {
		if msg.Role == model.RoleTool && msg.ToolCallID == "x1" {
			result = msg.Content
		}
	}
	if !strings.HasPrefix(result, "Exit code 0.\n65534\n3\n") {
		t.Errorf("execute's result in the transcript: %q", result)
	}
	// Read back through the files layer, as the gateway's file API does.
	if got, err := workdir("default", "ex").Read(ctx, "/out/count.txt"); err != nil || string(got) != "3\n" {
		t.Errorf("the command's file in the object store: %q, %v", got, err)
	}
}
