package gateway

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
)

// filesModel scripts the runs of the branch-files tests by the run's
// request (its last user message): each writes or reads files with the
// file tools, then answers; "slow" writes and then waits for the run's
// end (a cancel). read records what read_file answered.
type filesModel struct {
	mu   sync.Mutex
	read []string
}

func (fm *filesModel) model(t *testing.T) model.Model {
	call := func(id, name, args string) openaitest.Call {
		return openaitest.Call{ID: id, Name: name, Arguments: args}
	}
	llm := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		var asked string
		for _, m := range req.Messages {
			if m.Role == "user" {
				asked = m.Content
			}
		}
		if last := req.LastMessage(); last.Role == "tool" {
			if last.Name == tools.ToolReadFile || strings.HasPrefix(last.ToolCallID, "call_read") {
				fm.mu.Lock()
				fm.read = append(fm.read, last.Content)
				fm.mu.Unlock()
			}
			return openaitest.Text("done: " + asked)
		}
		switch asked {
		case "write one":
			return openaitest.Reply{ToolCalls: []openaitest.Call{call("call_w1", "write_file", `{"path":"/a.txt","content":"one"}`)}}
		case "write two":
			return openaitest.Reply{ToolCalls: []openaitest.Call{
				call("call_w2", "write_file", `{"path":"/a.txt","content":"two"}`),
				call("call_w3", "write_file", `{"path":"/b.txt","content":"bee"}`)}}
		case "read":
			return openaitest.Reply{ToolCalls: []openaitest.Call{call("call_read1", "read_file", `{"path":"/a.txt"}`)}}
		case "slow":
			return openaitest.Reply{ToolCalls: []openaitest.Call{
				call("call_s1", "write_file", `{"path":"/a.txt","content":"slow"}`),
				call("call_s2", "write_file", `{"path":"/c.txt","content":"sea"}`)}}
		}
		return openaitest.Text("nothing to do")
	})
	oa, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: llm.URL(), Model: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		last := req.Messages[len(req.Messages)-1]
		if last.Role == model.RoleTool && strings.HasPrefix(last.ToolCallID, "call_s") {
			<-ctx.Done() // "slow": held until the run is cancelled
			return nil, context.Cause(ctx)
		}
		return oa.Generate(ctx, req, onDelta)
	})
}

func (fm *filesModel) reads() []string {
	fm.mu.Lock()
	defer fm.mu.Unlock()
	return append([]string(nil), fm.read...)
}

// trusted is a run body whose tools run without asking.
func trusted(text string, kv ...any) map[string]any {
	return with(with(input(text), "config", map[string]any{"tool_approval_mode": "always_trust"}), kv...)
}

// listed returns the files a listing shows, path → content read through
// the same query.
func (e *env) listed(thread, query string) map[string]string {
	e.t.Helper()
	var views []fileView
	e.do("GET", "/threads/"+thread+"/files"+query, nil).expect(e.t, http.StatusOK).decode(e.t, &views)
	out := map[string]string{}
	for _, v := range views {
		out[v.Path] = string(e.do("GET", "/threads/"+thread+"/files"+v.Path+query, nil).expect(e.t, http.StatusOK).body)
	}
	return out
}

func sameFiles(got, want map[string]string) bool {
	if len(got) != len(want) {
		return false
	}
	for k, v := range want {
		if got[k] != v {
			return false
		}
	}
	return true
}

// The workdir follows the branch: a run forked from the first run's
// checkpoint sees a.txt as the first run wrote it and no b.txt; the old
// branch's head still has both, read through ?checkpoint_id=; the
// workdir's content is stored once per content.
func TestWorkdirFollowsTheBranch(t *testing.T) {
	fm := &filesModel{}
	e := newFilesEnv(t, fm.model(t), 0)
	e.do("POST", "/threads", map[string]any{"thread_id": "t1"}).expect(t, http.StatusOK)
	e.do("POST", "/threads/t1/runs/wait", trusted("write one", "run_id", "r1")).expect(t, http.StatusOK)
	first := e.state("/threads/t1/state")
	e.do("POST", "/threads/t1/runs/wait", trusted("write two", "run_id", "r2")).expect(t, http.StatusOK)
	second := e.state("/threads/t1/state")
	if got := e.listed("t1", ""); !sameFiles(got, map[string]string{"/a.txt": "two", "/b.txt": "bee"}) {
		t.Fatalf("after two runs the workdir holds %v", got)
	}
	if got := e.listed("t1", "?checkpoint_id="+first.id()); !sameFiles(got, map[string]string{"/a.txt": "one"}) {
		t.Fatalf("at the first run's checkpoint: %v", got)
	}

	// Fork from the first run's checkpoint.
	e.do("POST", "/threads/t1/runs/wait", trusted("read", "run_id", "r3", "checkpoint_id", first.id())).expect(t, http.StatusOK)
	if reads := fm.reads(); len(reads) != 1 || !strings.Contains(reads[0], "one") || strings.Contains(reads[0], "two") {
		t.Fatalf("the forked run read %q, want the first run's a.txt", reads)
	}
	if got := e.listed("t1", ""); !sameFiles(got, map[string]string{"/a.txt": "one"}) {
		t.Fatalf("after the fork the workdir holds %v", got)
	}
	if got := e.listed("t1", "?checkpoint_id="+second.id()); !sameFiles(got, map[string]string{"/a.txt": "two", "/b.txt": "bee"}) {
		t.Fatalf("the old branch's head holds %v", got)
	}
	e.do("GET", "/threads/t1/files/b.txt?checkpoint_id="+first.id(), nil).expect(t, http.StatusNotFound)
	e.do("GET", "/threads/t1/files?checkpoint_id=nope", nil).expect(t, http.StatusNotFound)
	e.do("GET", "/threads/t1/files?checkpoint_id=a.b", nil).expect(t, http.StatusBadRequest)

	// A fork by state update (no run) checks the files out at once.
	e.do("POST", "/threads/t1/state", map[string]any{"values": nil, "checkpoint_id": second.id()}).expect(t, http.StatusOK)
	if got := e.listed("t1", ""); !sameFiles(got, map[string]string{"/a.txt": "two", "/b.txt": "bee"}) {
		t.Fatalf("after an update on the old branch the workdir holds %v", got)
	}

	// A head moved without its files checked out (a gateway that stopped
	// between the two): the next run checks them out before it starts.
	if _, _, err := e.stores.Threads.Mutate(context.Background(), "default", "t1", func(th *protocol.Thread) error {
		th.FilesAt, th.Head = th.Head, first.id()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.do("POST", "/threads/t1/runs/wait", trusted("read", "run_id", "r4")).expect(t, http.StatusOK)
	if reads := fm.reads(); len(reads) != 2 || !strings.Contains(reads[1], "one") {
		t.Fatalf("the run on a head moved without its files read %q", reads)
	}
	if got := e.listed("t1", ""); !sameFiles(got, map[string]string{"/a.txt": "one"}) {
		t.Fatalf("after the run the workdir holds %v", got)
	}

	// Content is stored once per content, whatever the checkpoints.
	infos := objects(t, e.js, e.settings.Names.FilesBucket(), "default/t1/")
	if len(infos) != 3 { // one, two, bee
		t.Fatalf("objects %v, want one per content", infos)
	}
}

// A run cancelled with rollback takes its files with it: what it wrote
// goes, what it overwrote comes back.
func TestRollbackTakesTheRunsFiles(t *testing.T) {
	fm := &filesModel{}
	e := newFilesEnv(t, fm.model(t), 0)
	e.do("POST", "/threads", map[string]any{"thread_id": "t1"}).expect(t, http.StatusOK)
	e.do("POST", "/threads/t1/runs/wait", trusted("write one", "run_id", "r1")).expect(t, http.StatusOK)
	e.do("POST", "/threads/t1/runs", trusted("slow", "run_id", "r2")).expect(t, http.StatusOK)
	deadline := time.Now().Add(60 * time.Second)
	for !sameFiles(e.listed("t1", ""), map[string]string{"/a.txt": "slow", "/c.txt": "sea"}) {
		if time.Now().After(deadline) {
			t.Fatalf("the slow run never wrote its files: %v", e.listed("t1", ""))
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.do("POST", "/threads/t1/runs/r2/cancel?action=rollback&wait=1", nil).expect(t, http.StatusOK)
	for !sameFiles(e.listed("t1", ""), map[string]string{"/a.txt": "one"}) {
		if time.Now().After(deadline) {
			t.Fatalf("after the rollback the workdir holds %v", e.listed("t1", ""))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The next run starts from there.
	e.do("POST", "/threads/t1/runs/wait", trusted("read", "run_id", "r3")).expect(t, http.StatusOK)
	if reads := fm.reads(); len(reads) != 1 || !strings.Contains(reads[0], "one") {
		t.Fatalf("the run after the rollback read %q", reads)
	}
}

// Deleting a thread removes its file content and the checkpoints that
// name it; another thread's stay.
func TestDeleteThreadRemovesVersionedFiles(t *testing.T) {
	fm := &filesModel{}
	e := newFilesEnv(t, fm.model(t), 0)
	for _, th := range []string{"t1", "t2"} {
		e.do("POST", "/threads", map[string]any{"thread_id": th}).expect(t, http.StatusOK)
		e.do("POST", "/threads/"+th+"/runs/wait", trusted("write one", "run_id", th+"r1")).expect(t, http.StatusOK)
		e.do("POST", "/threads/"+th+"/runs/wait", trusted("write two", "run_id", th+"r2")).expect(t, http.StatusOK)
	}
	if n := len(objects(t, e.js, e.settings.Names.FilesBucket(), "default/t1/")); n != 3 {
		t.Fatalf("%d objects before the deletion", n)
	}
	e.do("DELETE", "/threads/t1", nil).expect(t, http.StatusNoContent)
	if left := objects(t, e.js, e.settings.Names.FilesBucket(), "default/t1/"); len(left) != 0 {
		t.Fatalf("objects left: %v", left)
	}
	ctx := context.Background()
	cps, err := e.js.KeyValue(ctx, e.settings.Names.CheckpointsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if keys, err := cps.ListKeysFiltered(ctx, "default.t1.>"); err == nil {
		for k := range keys.Keys() {
			t.Errorf("checkpoint left: %s", k)
		}
	}
	if got := e.listed("t2", ""); !sameFiles(got, map[string]string{"/a.txt": "two", "/b.txt": "bee"}) {
		t.Fatalf("the other thread holds %v", got)
	}
}

// TestLangGraphSDKFiles runs testdata/langgraph-sdk/files.mjs: forks,
// state updates and a rollback through the official SDK, with the
// workdir read through the file routes.
func TestLangGraphSDKFiles(t *testing.T) {
	fm := &filesModel{}
	e := newFilesEnv(t, fm.model(t), 0)
	runSDKScript(t, e, "files.mjs", 4)
}

// objects lists the live objects whose name starts with prefix.
func objects(t *testing.T, js jetstream.JetStream, bucket, prefix string) []string {
	t.Helper()
	store, err := js.ObjectStore(context.Background(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	infos, err := store.List(context.Background())
	if err != nil && err != jetstream.ErrNoObjectsFound {
		t.Fatal(err)
	}
	var out []string
	for _, i := range infos {
		if strings.HasPrefix(i.Name, prefix) && !i.Deleted {
			out = append(out, i.Name)
		}
	}
	return out
}
