package gateway

import (
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
)

// sdkDir is the pinned npm project of the official LangGraph JS SDK
// (.ci/run installs it with npm ci).
const sdkDir = "testdata/langgraph-sdk"

// sdkModel echoes the last message, asks a clarification for a message
// containing "ask me", fails for one containing "break", and streams a
// long answer slowly (ten seconds) for one starting "slow".
func sdkModel() *model.Scripted {
	return model.NewScripted(func(_ int, req *model.Request) model.Reply {
		last := req.Messages[len(req.Messages)-1]
		switch {
		case last.Role == model.RoleUser && strings.Contains(last.Content, "spawn a child"):
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "call_spawn", Name: "spawn", Arguments: `{}`}}}
		case last.Role == model.RoleUser && strings.Contains(last.Content, "ask me"):
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "q1", Name: "ask_clarification",
				Arguments: `{"question":"Which city?","type":"missing_info"}`}}}
		case last.Role == model.RoleUser && strings.HasPrefix(last.Content, "slow"):
			return model.Reply{Text: strings.Repeat("tick ", 200), Pieces: 200, PieceDelay: 50 * time.Millisecond}
		case strings.Contains(last.Content, "break"):
			return model.Reply{Err: errors.New("the model is broken")}
		case last.Role == model.RoleTool:
			return model.Reply{Text: "got: " + last.Content}
		}
		return model.Reply{Text: "echo: " + last.Content}
	})
}

// TestLangGraphSDK runs the official LangGraph JS SDK against the gateway
// (testdata/langgraph-sdk/state.mjs): values, state, history, time travel,
// interrupts, a run cancelled before the model answered, as a LangGraph
// client sees them. Without node or the
// installed SDK it skips, unless NATSAGENT_LANGGRAPH_TESTS=1 (CI), where it
// fails.
func TestLangGraphSDK(t *testing.T) {
	e := newEnv(t, sdkModel())
	runSDKScript(t, e, "state.mjs", 13)
}

// TestLangGraphSDKStream runs testdata/langgraph-sdk/stream.mjs: one check
// per stream mode, with runs.stream and runs.joinStream.
// The worker has the spawn tool, and a finished run "child1" on thread
// "kid" for it to name as its subagent.
func TestLangGraphSDKStream(t *testing.T) {
	wd := &workdirs{m: map[string]*files.Memory{}}
	e := newEnvWith(t, nil, func(s *Server) { s.cfg.Files = wd.open })
	e.startFileWorker(sdkModel(), wd, spawnTool{runs: e.stores.Runs})
	e.do("POST", "/threads/kid/runs/wait", with(input("child work"), "run_id", "child1")).expect(t, http.StatusOK)
	runSDKScript(t, e, "stream.mjs", 18)
}

// TestLangGraphSDKAssistants runs testdata/langgraph-sdk/assistants.mjs:
// the assistants client and threads.search/count. Its model answers with
// the model name a run asked for, so the script sees an assistant's
// config reach the run.
func TestLangGraphSDKAssistants(t *testing.T) {
	e := newEnvWith(t, nil, func(s *Server) { s.cfg.Graphs = []Graph{{Name: "chatbot"}, {Name: "coder"}} })
	e.startWorker(model.NewScripted(func(_ int, req *model.Request) model.Reply {
		return model.Reply{Text: "model: " + req.Model}
	}))
	runSDKScript(t, e, "assistants.mjs", 9)
}

// runSDKScript runs an SDK script against e's gateway and requires want
// checks passed.
func runSDKScript(t *testing.T, e *env, script string, want int) {
	t.Helper()
	node, err := exec.LookPath("node")
	missing := ""
	switch {
	case err != nil:
		missing = "node not found on PATH (Node 20 or later)"
	default:
		if _, err := os.Stat(filepath.Join(sdkDir, "node_modules", "@langchain", "langgraph-sdk", "package.json")); err != nil {
			missing = "the LangGraph SDK is not installed (run npm ci in internal/gateway/" + sdkDir + ")"
		}
	}
	if missing != "" {
		if os.Getenv("NATSAGENT_LANGGRAPH_TESTS") == "1" {
			t.Fatal(missing + "; NATSAGENT_LANGGRAPH_TESTS=1 requires it")
		}
		t.Skip(missing + "; set NATSAGENT_LANGGRAPH_TESTS=1 to make this a failure")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = sdkDir
	cmd.Env = append(os.Environ(), "LANGGRAPH_URL="+e.http.URL)
	out, err := cmd.CombinedOutput()
	t.Logf("SDK checks:\n%s", out)
	if err != nil {
		t.Fatalf("the SDK checks failed: %v", err)
	}
	// Every check ran: a script that stopped early must not pass.
	m := regexp.MustCompile(`(?m)^checks passed: (\d+)$`).FindSubmatch(out)
	if m == nil {
		t.Fatal("the script did not report its checks")
	}
	if n, _ := strconv.Atoi(string(m[1])); n != want {
		t.Fatalf("%d checks passed, want %d", n, want)
	}
}
