package gateway

import (
	"bytes"
	"context"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap/zaptest"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
	"github.com/natsagent/natsagent/internal/worker"
)

// objectStoreFiles opens the object store workdirs on a connection, the
// way app.Files does.
func objectStoreFiles(t *testing.T, js jetstream.JetStream, names bus.Names) func(tenant, thread string) files.Workdir {
	t.Helper()
	store, err := js.ObjectStore(context.Background(), names.FilesBucket())
	if err != nil {
		t.Fatal(err)
	}
	index, err := js.KeyValue(context.Background(), names.ThreadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	return func(tenant, thread string) files.Workdir { return files.NewObjectStore(store, index, tenant, thread) }
}

// newFilesEnv is a gateway whose file endpoints use the object store,
// with maxFile as the upload limit, and, when m is set, a worker on its
// own connection whose runs get the same workdirs.
func newFilesEnv(t *testing.T, m model.Model, maxFile int64) *env {
	t.Helper()
	e := newEnvWith(t, nil, func(s *Server) {
		s.cfg.Files = objectStoreFiles(t, s.js, s.names)
		if maxFile > 0 {
			s.cfg.MaxFileBytes = maxFile
		}
	})
	if m != nil {
		e.startFilesWorker(m)
	}
	return e
}

func (e *env) startFilesWorker(m model.Model) {
	e.t.Helper()
	nc, err := nats.Connect(e.srv.URL(), nats.MaxReconnects(-1))
	if err != nil {
		e.t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		e.t.Fatal(err)
	}
	agents, err := agent.NewAgents(m, tools.NewRegistry(), agent.Chatbot())
	if err != nil {
		e.t.Fatal(err)
	}
	w, err := worker.New(context.Background(), nc, worker.Config{
		Settings: e.settings, Concurrency: 4, Agents: agents, Logger: zaptest.NewLogger(e.t),
		WaitPoll: 200 * time.Millisecond, ShutdownGrace: 5 * time.Second,
		Files: objectStoreFiles(e.t, js, e.settings.Names),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			e.t.Error("worker did not stop")
		}
		nc.Close()
	})
}

// raw sends a request with a body of the given type.
func (e *env) raw(method, path, contentType string, body []byte) response {
	e.t.Helper()
	req, err := http.NewRequest(method, e.http.URL+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := e.http.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: data}
}

// multipartBody builds a form with the given (field, file name, content)
// parts.
func multipartBody(t *testing.T, parts ...[3]string) (string, []byte) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, p := range parts {
		var w io.Writer
		var err error
		if p[1] == "" {
			w, err = mw.CreateFormField(p[0])
		} else {
			w, err = mw.CreateFormFile(p[0], p[1])
		}
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write([]byte(p[2]))
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return mw.FormDataContentType(), buf.Bytes()
}

// A person uploads a file, lists and downloads it, and a run on another
// worker connection reads it with read_file: the model is told about it
// in its request only.
func TestFiles_UploadListDownloadAndRun(t *testing.T) {
	var sawBlock bool
	m := model.NewScripted(func(n int, req *model.Request) model.Reply {
		last := req.Messages[len(req.Messages)-1]
		if n == 0 {
			sawBlock = last.Role == model.RoleUser && strings.Contains(last.Content, "<attachments>") &&
				strings.Contains(last.Content, "notes.txt: /uploads/notes.txt")
			return model.Reply{ToolCalls: []model.ToolCall{{ID: "call_1", Name: tools.ToolReadFile, Arguments: `{"path":"/uploads/notes.txt"}`}}}
		}
		return model.Reply{Text: "The file says: " + last.Content}
	})
	e := newFilesEnv(t, m, 0)

	ctype, body := multipartBody(t,
		[3]string{"file", "notes.txt", "The secret word is papaya.\n"},
		[3]string{"comment", "", "ignored"},
		[3]string{"file", `..\..\evil name?.csv`, "a,b\n"},
	)
	var stored []fileView
	e.raw("POST", "/threads/t1/uploads", ctype, body).expect(t, http.StatusCreated).decode(t, &stored)
	if len(stored) != 2 || stored[0].Path != "/uploads/notes.txt" || stored[0].Size != 27 || stored[1].Path != "/uploads/evil name_.csv" {
		t.Fatalf("stored %+v", stored)
	}
	var put fileView
	e.raw("PUT", "/threads/t1/files/docs/plan.md", "text/markdown", []byte("# Plan\n")).expect(t, http.StatusCreated).decode(t, &put)
	if put.Path != "/docs/plan.md" || put.Size != 7 || put.ModTime.IsZero() {
		t.Errorf("put %+v", put)
	}

	var list []fileView
	e.do("GET", "/threads/t1/files", nil).expect(t, http.StatusOK).decode(t, &list)
	var paths []string
	for _, f := range list {
		paths = append(paths, f.Path)
	}
	if got := strings.Join(paths, ","); got != "/docs/plan.md,/uploads/evil name_.csv,/uploads/notes.txt" {
		t.Errorf("list %s", got)
	}
	got := e.do("GET", "/threads/t1/files/uploads/notes.txt", nil).expect(t, http.StatusOK)
	if string(got.body) != "The secret word is papaya.\n" || got.header.Get("Content-Type") != "text/plain; charset=utf-8" ||
		!strings.HasPrefix(got.header.Get("Content-Disposition"), "attachment") || got.header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("download %q %v", got.body, got.header)
	}
	if ct := e.do("GET", "/threads/t1/files/uploads/evil%20name_.csv", nil).expect(t, http.StatusOK).header.Get("Content-Type"); !strings.HasPrefix(ct, "text/csv") {
		t.Errorf("csv Content-Type %q", ct)
	}
	// Another thread has its own files.
	var other []fileView
	e.do("GET", "/threads/t2/files", nil).expect(t, http.StatusOK).decode(t, &other)
	if len(other) != 0 {
		t.Errorf("thread t2 lists %v", other)
	}

	rec := e.do("POST", "/threads/t1/runs/wait?format=natsagent", input("What does my note say?")).expect(t, http.StatusOK).run(t)
	if rec.Status != protocol.StatusSuccess || rec.Output == nil || !strings.Contains(rec.Output.Content, "     1\tThe secret word is papaya.") {
		t.Fatalf("run %+v", rec)
	}
	if !sawBlock {
		t.Error("the model's request had no <attachments> block naming the upload")
	}
	var st struct {
		Values struct {
			Messages []model.Message `json:"messages"`
		} `json:"values"`
	}
	e.do("GET", "/threads/t1/state", nil).expect(t, http.StatusOK).decode(t, &st)
	if len(st.Values.Messages) == 0 || st.Values.Messages[0].Content != "What does my note say?" {
		t.Errorf("stored user message: %+v", st.Values.Messages)
	}
	for _, msg := range st.Values.Messages {
		if strings.Contains(msg.Content, "<attachments>") {
			t.Errorf("the block reached the thread's state: %+v", msg)
		}
	}
}

func TestFiles_Refusals(t *testing.T) {
	e := newFilesEnv(t, nil, 1000)
	e.raw("PUT", "/threads/t1/files/a.txt", "", []byte("x")).expect(t, http.StatusCreated)

	if ae := e.do("GET", "/threads/t1/files/missing.txt", nil).expect(t, http.StatusNotFound).apiError(t); ae.Code != protocol.CodeNotFound || !strings.Contains(ae.Message, "/missing.txt") {
		t.Errorf("missing: %+v", ae)
	}
	// An encoded path that climbs out of the workdir.
	if ae := e.do("GET", "/threads/t1/files/..%2F..%2Fetc%2Fpasswd", nil).expect(t, http.StatusBadRequest).apiError(t); ae.Field != "path" || !strings.Contains(ae.Message, "leaves the workdir") {
		t.Errorf("climbing path: %+v", ae)
	}
	if ae := e.raw("PUT", "/threads/t1/files/..%2F..%2Fx", "", []byte("x")).expect(t, http.StatusBadRequest).apiError(t); ae.Field != "path" {
		t.Errorf("climbing put: %+v", ae)
	}
	e.raw("PUT", "/threads/t1/files/a%00b", "", []byte("x")).expect(t, http.StatusBadRequest)
	e.raw("PUT", "/threads/t1/files/a.txt/below", "", []byte("x")).expect(t, http.StatusConflict)
	e.do("GET", "/threads/bad.thread/files", nil).expect(t, http.StatusBadRequest)

	// Size limits: the raw body and a multipart upload.
	e.raw("PUT", "/threads/t1/files/ok.bin", "", bytes.Repeat([]byte("x"), 1000)).expect(t, http.StatusCreated)
	if ae := e.raw("PUT", "/threads/t1/files/big.bin", "", bytes.Repeat([]byte("x"), 1001)).expect(t, http.StatusRequestEntityTooLarge).apiError(t); !strings.Contains(ae.Message, "1000") {
		t.Errorf("too large: %+v", ae)
	}
	// A refused file in a form stores none of its files.
	ctype, body := multipartBody(t, [3]string{"file", "small.txt", "x"}, [3]string{"file", "big.bin", strings.Repeat("x", 1001)})
	e.raw("POST", "/threads/t1/uploads", ctype, body).expect(t, http.StatusRequestEntityTooLarge)
	ctype, body = multipartBody(t, [3]string{"file", "huge.bin", strings.Repeat("x", 200<<10)})
	e.raw("POST", "/threads/t1/uploads", ctype, body).expect(t, http.StatusRequestEntityTooLarge)
	ctype, body = multipartBody(t, [3]string{"other", "", "x"})
	e.raw("POST", "/threads/t1/uploads", ctype, body).expect(t, http.StatusBadRequest)
	e.raw("POST", "/threads/t1/uploads", "application/json", []byte(`{}`)).expect(t, http.StatusBadRequest)

	var list []fileView
	e.do("GET", "/threads/t1/files", nil).expect(t, http.StatusOK).decode(t, &list)
	if len(list) != 2 {
		t.Errorf("refused uploads left files: %+v", list)
	}
	// The rest of the API keeps its own body limit.
	e.raw("POST", "/threads", "application/json", bytes.Repeat([]byte(" "), 2<<20)).expect(t, http.StatusRequestEntityTooLarge)
}

func TestFiles_NoBackend(t *testing.T) {
	e := newEnv(t, nil)
	ae := e.do("GET", "/threads/t1/files", nil).expect(t, http.StatusNotFound).apiError(t)
	if !strings.Contains(ae.Message, "files.backend: none") {
		t.Errorf("no backend: %+v", ae)
	}
	e.raw("PUT", "/threads/t1/files/a.txt", "", []byte("x")).expect(t, http.StatusNotFound)
}

func TestSanitizeUploadName(t *testing.T) {
	for in, want := range map[string]string{
		"report.pdf":                         "report.pdf",
		"../../etc/passwd":                   "passwd",
		`C:\Users\me\My File (1).txt`:        "My File (1).txt",
		"..":                                 "upload",
		".bashrc":                            "bashrc",
		"résumé 2024.docx":                   "résumé 2024.docx",
		"报告.pdf":                             "报告.pdf",
		"a\x00b;rm -rf|.sh":                  "a_b_rm -rf_.sh",
		"":                                   "upload",
		strings.Repeat("n", 300) + ".tar.gz": strings.Repeat("n", 197) + ".gz",
	} {
		if got := sanitizeUploadName(in); got != want {
			t.Errorf("sanitize(%q) = %q, want %q", in, got, want)
		}
	}
}
