package middleware_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// pngBytes is a real 2x2 PNG.
func pngBytes(t *testing.T, c color.Color) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, 2, 2))
	for x := range 2 {
		for y := range 2 {
			img.Set(x, y, c)
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func viChain(t *testing.T, settings string, extra ...middleware.Middleware) *middleware.Chain {
	t.Helper()
	assembled, err := middleware.Assemble(middleware.ChainConfig{Settings: map[string]json.RawMessage{
		"view_image": json.RawMessage(settings),
	}}, middleware.Env{KnownTool: func(string) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	chain, err := middleware.NewChain(extra, assembled.Middlewares())
	if err != nil {
		t.Fatal(err)
	}
	return chain
}

// viRun runs the loop with a workdir and a model name.
func viRun(t *testing.T, chain *middleware.Chain, m model.Model, modelName string, wd files.Workdir) runResult {
	t.Helper()
	return viRunLogged(t, chain, m, modelName, wd, zap.NewNop())
}

// viRunLogged is viRun logging to log.
func viRunLogged(t *testing.T, chain *middleware.Chain, m model.Model, modelName string, wd files.Workdir, log *zap.Logger) runResult {
	t.Helper()
	st := &state.State{}
	host := &memHost{base: st.Clone()}
	rt := &middleware.Runtime{RunID: "r1", ThreadID: "h1", Tenant: "default", Agent: "test", Files: wd, Logger: log, Emit: host.Emit}
	out := agent.Execute(context.Background(), &agent.Run{
		Runtime: rt, Chain: chain, Model: m, ModelName: modelName, System: "sys",
		MaxSteps: 10, State: st, Host: host, ToolEnv: tools.Env{Files: wd},
		Input: []model.Message{{ID: "u1", Role: model.RoleUser, Content: "what is in the picture?"}},
	})
	if out.Stopped != nil || out.Status == protocol.StatusError {
		t.Fatalf("run failed: %+v", out)
	}
	if err := host.Checkpoint(context.Background(), out.Pending); err != nil {
		t.Fatal(err)
	}
	return runResult{out, st, host}
}

// checkpointsHold reports whether any checkpoint, as stored (JSON), holds s.
func checkpointsHold(t *testing.T, h *memHost, s string) bool {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, u := range h.checkpoints {
		data, err := json.Marshal(u)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte(s)) {
			return true
		}
	}
	return false
}

func viewOnce(args string) openaitest.Handler {
	return func(req *openaitest.Request) openaitest.Reply {
		if req.LastMessage().Role == "user" && strings.HasPrefix(req.LastMessage().Content, "what is in the picture?") {
			return openaitest.Reply{ToolCalls: []openaitest.Call{{ID: "v1", Name: middleware.ViewImageTool, Arguments: args}}}
		}
		return openaitest.Text("a red square")
	}
}

func openAIModel(t *testing.T, srv *openaitest.Server) model.Model {
	t.Helper()
	m, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: srv.URL(), Model: "default-model"})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A vision model gets the image as an image_url part with a data URL, in
// the request after the view only; state and checkpoints keep only the
// metadata, never the payload (deer-flow #4138).
func TestViewImageVisionModel(t *testing.T) {
	wd := files.NewMemory()
	img := pngBytes(t, color.RGBA{255, 0, 0, 255})
	if err := wd.Write(context.Background(), "/pics/red.png", img); err != nil {
		t.Fatal(err)
	}
	srv := openaitest.NewServer(t, viewOnce(`{"path":"pics/red.png"}`))
	res := viRun(t, viChain(t, `{"enabled": true}`), openAIModel(t, srv), "gpt-4o", wd)
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("violations %q", v)
	}
	reqs := srv.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	offered := false
	for _, tool := range reqs[0].Tools {
		offered = offered || tool.Function.Name == middleware.ViewImageTool
	}
	if !offered {
		t.Fatal("view_image is not offered")
	}
	want := "data:image/png;base64," + base64.StdEncoding.EncodeToString(img)
	last := reqs[1].LastMessage()
	var url string
	for _, p := range last.Parts {
		if p.Type == "image_url" && p.ImageURL != nil {
			url = p.ImageURL.URL
		}
	}
	if last.Role != "user" || url != want || !strings.Contains(last.Content, "/pics/red.png (image/png)") {
		t.Fatalf("last message of the request after the view: %+v", last)
	}
	payload := base64.StdEncoding.EncodeToString(img)
	if checkpointsHold(t, res.host, payload) || checkpointsHold(t, res.host, "data:image") {
		t.Fatal("a checkpoint holds the image payload")
	}
	for _, m := range res.st.Messages {
		if len(m.Parts) > 0 {
			t.Fatalf("state holds a message with parts: %+v", m)
		}
	}
	var viewed []middleware.ViewedImage
	if ok, _ := res.host.replay().Value(middleware.ViewedImagesValue, &viewed); !ok || len(viewed) != 1 ||
		viewed[0].Path != "/pics/red.png" || viewed[0].MIME != "image/png" || viewed[0].Size != int64(len(img)) || len(viewed[0].SHA256) != 64 {
		t.Fatalf("viewed_images %+v", viewed)
	}
	if res.out.Output == nil || res.out.Output.Content != "a red square" {
		t.Fatalf("output %+v", res.out.Output)
	}
}

// A model that cannot see images gets a text placeholder, no image part.
func TestViewImageNonVisionModel(t *testing.T) {
	wd := files.NewMemory()
	if err := wd.Write(context.Background(), "/a.gif", []byte("GIF89a\x01\x00\x01\x00")); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ settings, model string }{
		"unknown model":     {`{"enabled": true}`, "llama-3-8b"},
		"vision turned off": {`{"enabled": true, "vision": false}`, "gpt-4o"},
	} {
		t.Run(name, func(t *testing.T) {
			srv := openaitest.NewServer(t, viewOnce(`{"path":"/a.gif"}`))
			res := viRun(t, viChain(t, tc.settings), openAIModel(t, srv), tc.model, wd)
			if v := srv.Violations(); len(v) != 0 {
				t.Fatalf("violations %q", v)
			}
			last := srv.Requests()[1].LastMessage()
			if last.Role != "user" || len(last.Parts) != 0 || !strings.Contains(last.Content, "cannot see images") || !strings.Contains(last.Content, "/a.gif (image/gif") {
				t.Fatalf("placeholder %+v", last)
			}
			if r := tsResult(res.st, "v1"); r == nil || r.Status != model.ToolStatusSuccess || !strings.Contains(r.Content, "cannot see images") {
				t.Fatalf("tool result %+v", r)
			}
		})
	}
}

// vision: true makes any model name get the image.
func TestViewImageVisionSetting(t *testing.T) {
	wd := files.NewMemory()
	webp := append([]byte("RIFF\x10\x00\x00\x00WEBPVP8 "), make([]byte, 8)...)
	if err := wd.Write(context.Background(), "/w.bin", webp); err != nil {
		t.Fatal(err)
	}
	srv := openaitest.NewServer(t, viewOnce(`{"path":"/w.bin"}`))
	viRun(t, viChain(t, `{"enabled": true, "vision": true}`), openAIModel(t, srv), "my-local-model", wd)
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("violations %q", v)
	}
	last := srv.Requests()[1].LastMessage()
	if len(last.Parts) != 3 || !strings.HasPrefix(last.Parts[2].ImageURL.URL, "data:image/webp;base64,") {
		t.Fatalf("parts %+v", last.Parts)
	}
}

// Refusals: wrong type (by content, whatever the name), too big, missing,
// a directory, outside the workdir, bad arguments. None touches state.
func TestViewImageRefusals(t *testing.T) {
	wd := files.NewMemory()
	ctx := context.Background()
	_ = wd.Write(ctx, "/fake.png", []byte("this is text, not a PNG"))
	_ = wd.Write(ctx, "/big.png", append(pngBytes(t, color.Black), make([]byte, 200)...))
	_ = wd.Write(ctx, "/dir/x.png", pngBytes(t, color.White))
	cases := []struct{ args, want string }{
		{`{"path":"/fake.png"}`, "is not a PNG, JPEG, GIF or WebP image"},
		{`{"path":"/big.png"}`, "over the 150 bytes"},
		{`{"path":"/missing.png"}`, "no such file"},
		{`{"path":"/dir"}`, "is a directory"},
		{`{"path":"../../etc/passwd"}`, "leaves the workdir"},
		{`{"path":"/a\u0000.png"}`, "invalid path"},
		{`{"file":"/fake.png"}`, `view_image takes {"path"`},
	}
	for _, tc := range cases {
		m := model.NewScripted(func(n int, req *model.Request) model.Reply {
			if n == 0 {
				return model.Reply{ToolCalls: []model.ToolCall{{ID: "v1", Name: middleware.ViewImageTool, Arguments: tc.args}}}
			}
			if last := req.Messages[len(req.Messages)-1]; last.Role != model.RoleTool {
				t.Errorf("%s: a message follows the refused view: %+v", tc.args, last)
			}
			return model.Reply{Text: "ok"}
		})
		res := viRun(t, viChain(t, `{"enabled": true, "vision": true, "max_bytes": 150}`), m, "gpt-4o", wd)
		r := tsResult(res.st, "v1")
		if r == nil || r.Status != model.ToolStatusError || !strings.Contains(r.Content, tc.want) {
			t.Errorf("%s: result %+v, want an error containing %q", tc.args, r, tc.want)
		}
		if _, ok := res.st.Values[middleware.ViewedImagesValue]; ok {
			t.Errorf("%s: viewed_images set by a refused view", tc.args)
		}
	}
}

// A file changed between the view and the next model call is not shown:
// the request says so instead.
func TestViewImageChangedFileSkipped(t *testing.T) {
	wd := files.NewMemory()
	ctx := context.Background()
	_ = wd.Write(ctx, "/a.png", pngBytes(t, color.White))
	// Runs before view_image's hooks: changes the file after the tool
	// batch, before the next model call.
	changer := &mw{name: "changer", rec: &recorder{}, bm: func(ctx context.Context, rt *middleware.Runtime, st *state.State) (middleware.Result, error) {
		if rt.Step == 1 {
			return middleware.Result{}, wd.Write(ctx, "/a.png", pngBytes(t, color.Black))
		}
		return middleware.Result{}, nil
	}}
	srv := openaitest.NewServer(t, viewOnce(`{"path":"/a.png"}`))
	viRun(t, viChain(t, `{"enabled": true}`, changer), openAIModel(t, srv), "gpt-4o", wd)
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("violations %q", v)
	}
	last := srv.Requests()[1].LastMessage()
	if len(last.Parts) != 0 || !strings.Contains(last.Content, "/a.png: not shown: the file changed since you viewed it") {
		t.Fatalf("request after the change: %+v", last)
	}
}

// Without a workdir the tool is not offered.
func TestViewImageNeedsWorkdir(t *testing.T) {
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		for _, s := range req.Tools {
			if s.Name == middleware.ViewImageTool {
				t.Error("view_image offered without a workdir")
			}
		}
		return model.Reply{Text: "ok"}
	})
	viRun(t, viChain(t, `{"enabled": true}`), m, "gpt-4o", nil)
}

func TestVisionModel(t *testing.T) {
	for name, want := range map[string]bool{
		"gpt-4o": true, "gpt-4o-mini": true, "openai/gpt-4.1": true, "gpt-5-mini": true,
		"claude-3-5-sonnet-latest": true, "anthropic/claude-sonnet-4": true, "gemini-2.0-flash": true,
		"Qwen2.5-VL-7B-Instruct": true, "llama-3.2-11b-vision": true,
		"gpt-3.5-turbo": false, "o3-mini": false, "llama-3-8b": false, "": false, "deepseek-chat": false,
	} {
		if got := middleware.VisionModel(name); got != want {
			t.Errorf("VisionModel(%q) = %v, want %v", name, got, want)
		}
	}
	for _, bad := range []string{`{"enabled": true, "max_bytes": -1}`, `{"enabled": true, "max_bytes": 209715200}`, `{"enabled": true, "vision": "yes"}`} {
		_, err := middleware.Assemble(middleware.ChainConfig{Settings: map[string]json.RawMessage{"view_image": json.RawMessage(bad)}},
			middleware.Env{KnownTool: func(string) bool { return true }})
		if err == nil || !strings.Contains(err.Error(), "settings.view_image") {
			t.Errorf("%s: %v", bad, err)
		}
	}
}
