package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// Seeds shared by the decoder's fuzz target: valid requests of each shape
// and the bad input people and programs actually send. Interesting inputs
// the fuzzer found live in testdata/fuzz/FuzzDecodeRunRequest.
var runRequestSeeds = []string{
	`{"run_id":"r1","thread_id":"t1","input":{"messages":[{"role":"user","content":"hi"}]}}`,
	`{"run_id":"r1","thread_id":"t1","tenant":"acme","agent":"chatbot","multitask_strategy":"steer","input":{"messages":[{"id":"m1","role":"system","content":"be brief"},{"role":"user","content":"hi"}]},"config":{"model":"m","tool_approval_mode":"always_trust","max_steps":5,"timeout_seconds":60,"user_id":"u1"},"metadata":{"n":12345678901234567890,"x":[1,{"y":null}]},"parent":{"run_id":"p1","thread_id":"pt","tool_call_id":"c1"}}`,
	`{"run_id":"r2","thread_id":"t1","command":{"resume":{"decisions":[{"type":"edit","arguments":{"a":1}}]}}}`,
	`{"run_id":"r2","thread_id":"t1","command":{"resume":"yes"}}`,
	`{"run_id":"r1","thread_id":"t1","command":{"resume":null}}`,
	`{"run_id":"r1","thread_id":"t1","input":{"messages":[{"role":"user","content":"x","parts":[{"type":"image_url","image_url":"data:,"}]}]}}`,
	`{"RUN_ID":"r1","Thread_Id":"t1","input":{"messages":[{"role":"user","content":"case-insensitive keys"}]}}`,
	`{"run_id":"r\u002e1","thread_id":"t1","input":{"messages":[{"role":"user","content":"escaped dot"}]}}`,
	`{"run_id":"r1","run_id":"r.2","thread_id":"t1","input":{"messages":[{"role":"user","content":"duplicate key"}]}}`,
	`{"run_id":"r1","thread_id":"t1","input":{"messages":[{"role":"user","content":"\ud800 lone surrogate"}]}}`,
	`{"run_id":"r1","thread_id":"t1","input":{"messages":[{"role":"user","content":"<&>"}]},"metadata":{"html":"<script>"}}`,
	`{"run_id":"r1","thread_id":"t1","config":{"max_steps":"5"},"input":{"messages":[{"role":"user","content":"x"}]}}`,
	`{"run_id":"r1","thread_id":"t1","config":{"max_steps":1e3},"input":{"messages":[{"role":"user","content":"x"}]}}`,
	`{"run_id":"r1","thread_id":"t1","metadata":` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `,"input":{"messages":[{"role":"user","content":"x"}]}}`,
	"{\"run_id\":\"r1\",\"thread_id\":\"t1\",\"input\":{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}}",
	"{\"run_id\":\"r1\",\"thread_id\":\"t1\",\"metadata\":{\"\xc3\":1},\"input\":{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}}",
	`{"run_id":"r1"} {}`,
	`[]`,
	`null`,
	``,
}

// FuzzDecodeRunRequest: whatever bytes arrive on a run subject, decoding
// never panics; a failure is a ValidationError (which the worker dead-
// letters with its reason); a success is a request whose every id is a
// valid token, with input xor command, that survives a round trip through
// its own encoding unchanged (what a worker re-reads is what was accepted).
func FuzzDecodeRunRequest(f *testing.F) {
	for _, s := range runRequestSeeds {
		f.Add([]byte(s), "", "")
	}
	f.Add([]byte(`{"run_id":"r1","input":{"messages":[{"role":"user","content":"x"}]}}`), "acme", "t9")
	f.Add([]byte(`{"run_id":"r1","thread_id":"t1","config":{"timeout_seconds":9300000000,"max_steps":9223372036854775807},"input":{"messages":[{"role":"user","content":"x"}]}}`), "", "")
	f.Add([]byte(`{"run_id":"r1","thread_id":"t1","config":{"timeout_seconds":9300000000},"input":{"messages":[{"role":"user","content":"x"}]}}`), "", "")
	f.Add([]byte(`{"run_id":"r1","thread_id":"t1","config":{"timeout_seconds":604800,"max_steps":10000},"input":{"messages":[{"role":"user","content":"x"}]}}`), "", "")
	f.Add([]byte(`{"run_id":"r1","input":{"messages":[{"role":"user","content":"x"}]}}`), "a.b", "*")
	f.Fuzz(func(t *testing.T, data []byte, tenant, thread string) {
		req, err := DecodeRunRequestFor(data, 4<<10, tenant, thread)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %T %v is not a ValidationError", err, err)
			}
			if !utf8.ValidString(ve.Error()) {
				// %q keeps the message printable whatever the input.
				t.Fatalf("error message is not valid UTF-8: %q", ve.Error())
			}
			return
		}
		if !utf8.Valid(data) {
			t.Fatal("accepted a request that is not valid UTF-8")
		}
		if CheckJSON(data, MaxJSONDepth) != nil {
			t.Fatal("accepted a request CheckJSON refuses")
		}
		for _, id := range []string{req.RunID, req.ThreadID, req.Tenant, req.Agent} {
			if !ValidToken(id) {
				t.Fatalf("accepted id %q", id)
			}
		}
		// Every number a client sends is bounded: converting it to a
		// time.Duration must not overflow.
		if c := req.Config; c.TimeoutSeconds < 0 || c.TimeoutSeconds > MaxTimeoutSeconds || c.MaxSteps < 0 || c.MaxSteps > MaxRunSteps {
			t.Fatalf("accepted config %+v", c)
		}
		if d := time.Duration(req.Config.TimeoutSeconds) * time.Second; d < 0 {
			t.Fatalf("timeout_seconds %d overflows to %s", req.Config.TimeoutSeconds, d)
		}
		if (req.Input == nil) == (req.Command == nil) {
			t.Fatal("accepted a request without exactly one of input and command")
		}
		enc, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("an accepted request does not encode: %v", err)
		}
		again, err := DecodeRunRequest(enc, 1<<20)
		if err != nil {
			t.Fatalf("the encoding of an accepted request is refused: %v\n%s", err, enc)
		}
		enc2, err := json.Marshal(again)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(enc, enc2) {
			t.Fatalf("round trip changed the request:\n%s\n%s", enc, enc2)
		}
	})
}

// FuzzCheckJSON: the scanner never panics, and what it accepts from valid
// JSON is within the depth limit and holds only valid UTF-8 strings.
func FuzzCheckJSON(f *testing.F) {
	for _, s := range runRequestSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(`"\\\"\u00e9"`))
	f.Add([]byte(`{"a":{"b":[[],[{}],"\"]"]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		err := CheckJSON(data, 8)
		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %T", err)
			}
			if !json.Valid(data) {
				return
			}
			// On valid JSON the scanner only refuses what it must.
			if utf8.Valid(data) && depthOf(data) <= 8 {
				t.Fatalf("refused valid JSON of depth %d: %v", depthOf(data), err)
			}
			return
		}
		if !json.Valid(data) {
			return
		}
		if d := depthOf(data); d > 8 {
			t.Fatalf("accepted depth %d", d)
		}
		if !utf8.Valid(data) {
			// Invalid bytes in valid JSON can only sit in strings, which
			// the scanner must have caught.
			t.Fatalf("accepted invalid UTF-8 in %q", data)
		}
	})
}

// depthOf measures the nesting of valid JSON with the standard tokenizer.
func depthOf(data []byte) int {
	dec := json.NewDecoder(bytes.NewReader(data))
	depth, max := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return max
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
			if depth > max {
				max = depth
			}
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}
