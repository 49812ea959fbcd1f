package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/protocol"
)

// FuzzRunBody drives the gateway's run body decoding (decodeBody, then
// request) with any bytes. A refusal is a 400 or 413 with the API's error
// code, never a 500; an accepted body is a run request that the worker's
// own decoder accepts unchanged: what the gateway publishes is never
// dead-lettered for its shape.
func FuzzRunBody(f *testing.F) {
	seeds := []string{
		`{"input":{"messages":[{"role":"user","content":"hi"}]}}`,
		`{"assistant_id":"chatbot","input":{"messages":[{"type":"human","content":[{"type":"text","text":"hi"},{"type":"text","text":" there"}]}]},"config":{"configurable":{"model":"m","max_steps":3,"user_id":"u1","tool_approval_mode":"always_trust"}},"metadata":{"n":1e400,"s":"<&>"},"multitask_strategy":"interrupt","run_id":"r1","if_not_exists":"reject"}`,
		`{"command":{"resume":{"decisions":[{"type":"approve"}]}}}`,
		`{"command":{"resume":"yes","update":{},"goto":null}}`,
		`{"input":{"messages":[{"role":"ai","content":"x"}]}}`,
		`{"input":{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}}`,
		`{"input":{"messages":[{"role":"user","content":{"a":1}}]}}`,
		`{"input":{"messages":[{"role":"user","content":"x"}]},"config":{"max_steps":"5"}}`,
		`{"input":{"messages":[{"role":"user","content":"x"}]},"config":{"configurable":{"max_steps":1.5}}}`,
		`{"input":{"messages":[{"role":"user","content":"x"}]},"config":[]}`,
		`{"input":{"messages":[{"role":"user","content":"x"}]},"agent":"a","assistant_id":"b"}`,
		`{"input":{"messages":[{"role":"user","content":"x","id":"a.b"}]}}`,
		`{"input":{"messages":[{"role":"user","content":"\u0000\ud800"}]}}`,
		`{"input":` + strings.Repeat("[", 100) + `}`,
		"{\"input\":{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}}",
		`{"input":{"messages":[{"type":"ai","content":"","tool_calls":[{"id":"c","name":"f","args":{"a":1}}]}]},"checkpoint_id":"e1-1"}`,
		`{"input":{"messages":[{"type":"human","content":"x"}]},"checkpoint":{"checkpoint_id":"e1-1","checkpoint_ns":""}}`,
		`{"input":{"messages":[{"type":"human","content":"x"}]},"checkpoint":{"configurable":{"checkpoint_id":5}}}`,
		`{"input":{"messages":[{"type":"tool","content":"x","tool_call_id":"c"}]},"checkpoint":7}`,
		`{} {}`, `[]`, `null`, ``, ` `, `"x"`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	s := &Server{cfg: Config{DefaultAgent: protocol.DefaultAgent}}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := httptest.NewRequest("POST", "/threads/t1/runs", bytes.NewReader(data))
		r.Body = http.MaxBytesReader(httptest.NewRecorder(), r.Body, 64<<10)
		var body runBody
		err := decodeBody(r, &body)
		var req *protocol.RunRequest
		if err == nil {
			req, err = s.request(&body, "default", "t1")
		}
		if err != nil {
			ae := classify(err)
			if (ae.status != http.StatusBadRequest && ae.status != http.StatusRequestEntityTooLarge) || ae.code != protocol.CodeInvalid {
				t.Fatalf("body %q answered %d %s: %v", data, ae.status, ae.code, err)
			}
			return
		}
		enc, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("accepted request does not encode: %v", err)
		}
		got, err := protocol.DecodeRunRequestFor(enc, 1<<20, "default", "t1")
		if err != nil {
			t.Fatalf("the gateway accepts %q but the worker refuses what it publishes: %v\n%s", data, err, enc)
		}
		if enc2, _ := json.Marshal(got); !bytes.Equal(enc, enc2) {
			t.Fatalf("the worker reads another request:\n%s\n%s", enc, enc2)
		}
	})
}
