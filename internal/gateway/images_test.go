package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"image"
	"image/png"
	"net/http"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
	"github.com/natsagent/natsagent/internal/protocol"
)

// testPNG is a real PNG of w×h pixels.
func testPNG(t *testing.T, w, h int) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func dataURL(data []byte) string {
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(data)
}

func sha(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

func imageInput(blocks ...map[string]any) map[string]any {
	return map[string]any{"input": map[string]any{"messages": []map[string]any{{"role": "user", "content": blocks}}}}
}

func textBlock(s string) map[string]any { return map[string]any{"type": "text", "text": s} }

// newImageEnv is a gateway and worker with files, on an OpenAI-compatible
// test model.
func newImageEnv(t *testing.T) (*env, *openaitest.Server) {
	t.Helper()
	llm := openaitest.NewServer(t, func(*openaitest.Request) openaitest.Reply { return openaitest.Text("I see it.") })
	oa, err := model.NewOpenAI(model.OpenAIConfig{BaseURL: llm.URL(), Model: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return newFilesEnv(t, oa, 0), llm
}

// imageParts returns the image URLs of the user messages of a model request.
func imageParts(req openaitest.Request) []string {
	var out []string
	for _, m := range req.Messages {
		for _, p := range m.Parts {
			if m.Role == "user" && p.Type == "image_url" && p.ImageURL != nil {
				out = append(out, p.ImageURL.URL)
			}
		}
	}
	return out
}

// An image sent inline (OpenAI image_url with a data URL, or LangChain's
// base64 image block) is stored in the thread's files, the thread keeps
// a reference, and the model receives the same bytes as an image part,
// in this run and the next.
func TestInputImagesReachModel(t *testing.T) {
	e, llm := newImageEnv(t)
	img := testPNG(t, 3, 2)
	img2 := testPNG(t, 1, 1)
	body := imageInput(textBlock("What is this?"),
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": dataURL(img)}},
		map[string]any{"type": "image", "source_type": "base64", "data": base64.StdEncoding.EncodeToString(img2), "mime_type": "image/png"},
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": "https://example.com/cat.png"}})
	e.do("POST", "/threads/t1/runs/wait", body).expect(t, http.StatusOK)

	if v := llm.Violations(); len(v) > 0 {
		t.Fatalf("transcript violations: %v", v)
	}
	reqs := llm.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d model requests", len(reqs))
	}
	want := []string{dataURL(img), dataURL(img2), "https://example.com/cat.png"}
	if got := imageParts(reqs[0]); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("the model got images %.80q, want %.80q", got, want)
	}

	// The bytes are files of the thread; the state holds references.
	for _, data := range [][]byte{img, img2} {
		p := protocol.InputImagesDir + "/" + sha(data) + ".png"
		got := e.do("GET", "/threads/t1/files"+p, nil).expect(t, http.StatusOK)
		if !bytes.Equal(got.body, data) {
			t.Fatalf("%s holds %d bytes, want the image's %d", p, len(got.body), len(data))
		}
	}
	state := e.do("GET", "/threads/t1/state", nil).expect(t, http.StatusOK)
	if bytes.Contains(state.body, []byte(base64.StdEncoding.EncodeToString(img))) || bytes.Contains(state.body, []byte("data:image")) {
		t.Fatalf("the thread's state holds the image bytes: %.300s", state.body)
	}
	if !bytes.Contains(state.body, []byte(`"sha256":"`+sha(img)+`"`)) {
		t.Fatalf("the state has no reference to the image: %.600s", state.body)
	}

	// The next run of the thread shows the model the same image again.
	e.do("POST", "/threads/t1/runs/wait", input("And now?")).expect(t, http.StatusOK)
	reqs = llm.Requests()
	if got := imageParts(reqs[len(reqs)-1]); len(got) != 3 || got[0] != dataURL(img) {
		t.Fatalf("the second run's request has images %.80q", got)
	}
}

// A client may name an image of its own thread by hash (as the state
// shows it), never one of another thread: the answer does not tell
// whether the other thread has it.
func TestInputImageOfAnotherThreadRefused(t *testing.T) {
	e, llm := newImageEnv(t)
	img := testPNG(t, 4, 4)
	e.do("POST", "/threads/a/runs/wait", imageInput(textBlock("look"),
		map[string]any{"type": "image_url", "image_url": map[string]any{"url": dataURL(img)}})).expect(t, http.StatusOK)
	ref := map[string]any{"type": "image_file", "image_file": map[string]any{"sha256": sha(img), "mime_type": "image/png"}}

	res := e.do("POST", "/threads/b/runs/wait", imageInput(textBlock("steal"), ref)).expect(t, http.StatusBadRequest)
	if msg := res.apiError(t).Message; !strings.Contains(msg, "this thread has no image") {
		t.Fatalf("error %q", msg)
	}
	unknown := map[string]any{"type": "image_file", "image_file": map[string]any{"sha256": strings.Repeat("a", 64), "mime_type": "image/png"}}
	res2 := e.do("POST", "/threads/b/runs/wait", imageInput(textBlock("guess"), unknown)).expect(t, http.StatusBadRequest)
	if a, b := res.apiError(t).Message, res2.apiError(t).Message; strings.ReplaceAll(a, sha(img), "") != strings.ReplaceAll(b, strings.Repeat("a", 64), "") {
		t.Fatalf("another thread's image and no image answer differently: %q / %q", a, b)
	}
	if n := llm.Count(); n != 1 {
		t.Fatalf("%d model requests; the refused runs reached the model", n)
	}

	// Its own thread's image, by reference: accepted, and the model sees it.
	e.do("POST", "/threads/a/runs/wait", imageInput(textBlock("again"), ref)).expect(t, http.StatusOK)
	reqs := llm.Requests()
	if got := imageParts(reqs[len(reqs)-1]); len(got) != 2 || got[1] != dataURL(img) {
		t.Fatalf("images %.80q", got)
	}
}

func TestInputImageChecks(t *testing.T) {
	e, llm := newImageEnv(t)
	e.gw.cfg.Images.MaxBytes = 200
	big := testPNG(t, 200, 200)
	noise := make([]byte, 300)
	for i := range noise {
		noise[i] = byte(i * 7)
	}
	big = append(big[:len(big):len(big)], noise...) // incompressible tail
	small := testPNG(t, 2, 2)
	for _, c := range []struct {
		name   string
		block  map[string]any
		status int
		says   string
	}{
		{"over the cap", map[string]any{"type": "image_url", "image_url": map[string]any{"url": dataURL(big)}}, http.StatusRequestEntityTooLarge, "images.max_bytes"},
		{"not an image", map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte("#!/bin/sh\necho hi\n"))}}, http.StatusBadRequest, "not a PNG"},
		{"declared type differs", map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/jpeg;base64," + base64.StdEncoding.EncodeToString(small)}}, http.StatusBadRequest, "not the image/jpeg"},
		{"svg", map[string]any{"type": "image_url", "image_url": map[string]any{"url": "data:image/svg+xml;base64,PHN2Zy8+"}}, http.StatusBadRequest, "not an accepted image type"},
		{"bad base64", map[string]any{"type": "image", "source_type": "base64", "data": "***", "mime_type": "image/png"}, http.StatusBadRequest, "not valid base64"},
		{"file url", map[string]any{"type": "image_url", "image_url": map[string]any{"url": "file:///etc/passwd"}}, http.StatusBadRequest, "http(s)"},
		{"bad ref", map[string]any{"type": "image_file", "image_file": map[string]any{"sha256": "../../x", "mime_type": "image/png"}}, http.StatusBadRequest, "sha256"},
	} {
		res := e.do("POST", "/threads/t1/runs/wait", imageInput(textBlock("x"), c.block)).expect(t, c.status)
		if msg := res.apiError(t).Message; !strings.Contains(msg, c.says) {
			t.Errorf("%s: error %q, want it to say %q", c.name, msg, c.says)
		}
	}
	// The per-request count.
	var blocks []map[string]any
	for range e.gw.cfg.Images.MaxPerRequest + 1 {
		blocks = append(blocks, map[string]any{"type": "image_url", "image_url": map[string]any{"url": dataURL(small)}})
	}
	if msg := e.do("POST", "/threads/t1/runs/wait", imageInput(blocks...)).expect(t, http.StatusBadRequest).apiError(t).Message; !strings.Contains(msg, "images.max_per_request") {
		t.Errorf("too many images: %q", msg)
	}
	// URLs refused by configuration.
	e.gw.cfg.Images.RefuseURLs = true
	url := map[string]any{"type": "image_url", "image_url": map[string]any{"url": "https://example.com/a.png"}}
	if msg := e.do("POST", "/threads/t1/runs/wait", imageInput(url)).expect(t, http.StatusBadRequest).apiError(t).Message; !strings.Contains(msg, "refuse_urls") {
		t.Errorf("refused URL: %q", msg)
	}
	if n := llm.Count(); n != 0 {
		t.Fatalf("%d model requests", n)
	}
	list := e.do("GET", "/threads/t1/files", nil)
	if bytes.Contains(list.body, []byte(protocol.InputImagesDir)) {
		t.Fatalf("a refused image was stored: %s", list.body)
	}
}
