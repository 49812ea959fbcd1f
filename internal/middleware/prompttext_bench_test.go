package middleware

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
)

// BenchmarkSharedPromptsWithMemory measures a model call's chain when one
// run in four has memory of its own (a different note each) and the
// others none: what the calls allocate, and how often a run without
// memory gets a new copy of the profile's prompt (rebuilt/plain) instead
// of the one its runs share. The profile's prompt is 4 KiB.
func BenchmarkSharedPromptsWithMemory(b *testing.B) {
	c, err := Assemble(ChainConfig{Settings: map[string]json.RawMessage{"memory": json.RawMessage(`{"enabled": true}`)}},
		Env{Memory: unusedMemory{}, KnownTool: known("search")})
	if err != nil {
		b.Fatal(err)
	}
	system := strings.Repeat("You help the user with their questions. ", 100)
	tools := specs("search")
	var got string
	base := func(ctx context.Context, req *ModelRequest) (*ModelResponse, error) {
		got = req.System
		return &ModelResponse{Response: &model.Response{Message: asst("", "ok"), FinishReason: model.FinishStop}}, nil
	}
	call := func(notes string) {
		rt, _ := newRuntime("r")
		Scratch(rt, "memory:load", func() *memoryLoad { return &memoryLoad{notes: notes} })
		if _, err := c.ModelCall(rt, base)(context.Background(), &ModelRequest{System: system, Tools: tools, State: &state.State{}}); err != nil {
			b.Fatal(err)
		}
	}
	call("") // the first call builds what calls reuse (the tokenizer)
	shared := unsafe.StringData(got)
	plain, rebuilt := 0, 0
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		notes := ""
		if i%4 == 0 {
			notes = "The user lives in city " + strconv.Itoa(i) + "."
		}
		call(notes)
		if notes == "" {
			if p := unsafe.StringData(got); p != shared {
				shared = p
				rebuilt++
			}
			plain++
		}
		i++
	}
	b.ReportMetric(float64(rebuilt)/float64(max(plain, 1)), "rebuilt/plain")
}
