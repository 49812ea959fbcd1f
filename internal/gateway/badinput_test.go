package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/protocol"
)

// Bad input at the HTTP edge gets a JSON error that names the field: 400
// for invalid UTF-8 and for nesting deeper than protocol.MaxJSONDepth
// (10,000 levels included: no stack blowup, no slow decode), 413 for a
// body over the limit. Nothing reaches the runs stream.
func TestBadInputGetsClearErrors(t *testing.T) {
	// Run bodies may also hold inline images (images.go): a small image
	// allowance keeps this body small.
	e := newEnvWith(t, nil, func(s *Server) { s.cfg.Images = ImageLimits{MaxBytes: 3000, MaxPerRequest: 1} })
	runLimit := DefaultMaxBodyBytes + 3000/3*4 + 4
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	msg := `{"role":"user","content":"hi"}`
	cases := []struct {
		name, path, body string
		status           int
		field, message   string
	}{
		{"10000 nested arrays in input", "/threads/t1/runs", `{"input":` + nest(10000) + `}`, 400, "input" + strings.Repeat("[0]", 32) + "...", "deeper than 64 levels"},
		{"10000 nested arrays in content", "/threads/t1/runs", `{"input":{"messages":[{"role":"user","content":` + nest(10000) + `}]}}`, 400, "input.messages[0].content" + strings.Repeat("[0]", 26) + "...", "deeper than 64"},
		{"deep metadata", "/threads/t1/runs", `{"input":{"messages":[` + msg + `]},"metadata":{"a":` + strings.Repeat(`{"b":`, 70) + `1` + strings.Repeat("}", 70) + `}}`, 400, "metadata.a" + strings.Repeat(".b", 46) + "...", "deeper than 64"},
		{"deep resume", "/threads/t1/runs", `{"command":{"resume":` + nest(10000) + `}}`, 400, "command.resume" + strings.Repeat("[0]", 29) + "...", "deeper than 64"},
		{"deep thread metadata", "/threads", `{"metadata":` + nest(100) + `}`, 400, "metadata" + strings.Repeat("[0]", 31) + "...", "deeper than 64"},
		{"invalid UTF-8 in content", "/threads/t1/runs", "{\"input\":{\"messages\":[" + msg + ",{\"role\":\"user\",\"content\":\"caf\xe9\"}]}}", 400, "input.messages[1].content", "is not valid UTF-8"},
		{"invalid UTF-8 in a metadata key", "/threads/t1/runs", "{\"input\":{\"messages\":[" + msg + "]},\"metadata\":{\"k\xff\":1}}", 400, "metadata", "key that is not valid UTF-8"},
		{"invalid UTF-8 in thread metadata", "/threads", "{\"metadata\":{\"note\":\"\xc3(\"}}", 400, "metadata.note", "is not valid UTF-8"},
		{"invalid UTF-8 outside strings", "/threads", "{\"metadata\":{}}\xff", 400, "", "not valid UTF-8"},
		{"body over the limit", "/threads/t1/runs", `{"input":{"messages":[{"role":"user","content":"` + strings.Repeat("x", runLimit) + `"}]}}`, 413, "", fmt.Sprintf("over the limit of %d bytes", runLimit)},
		{"thread body over the limit", "/threads", `{"metadata":{"x":"` + strings.Repeat("x", DefaultMaxBodyBytes) + `"}}`, 413, "", "over the limit of 1048576 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := e.raw("POST", c.path, "application/json", []byte(c.body)).expect(t, c.status)
			if ct := r.header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type %q", ct)
			}
			er := r.apiError(t)
			if er.Code != protocol.CodeInvalid || er.Field != c.field || !strings.Contains(er.Message, c.message) {
				t.Fatalf("error %+v, want field %q and message with %q", er, c.field, c.message)
			}
		})
	}
	// At the limit is fine.
	ok := `{"input":{"messages":[` + msg + `]},"metadata":{"a":` + nest(protocol.MaxJSONDepth-2) + `}}`
	if rec := e.raw("POST", "/threads/t1/runs", "application/json", []byte(ok)).expect(t, http.StatusOK).run(t); rec.Status != protocol.StatusPending {
		t.Fatalf("run at the depth limit: %+v", rec)
	}
	st, err := e.js.Stream(context.Background(), e.settings.Names.RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("%d requests published, want only the valid one", info.State.Msgs)
	}
}
