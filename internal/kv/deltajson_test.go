package kv

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
)

// TestDeltaJSONMatchesEncodingJSON: checkpoints of every shape a run
// writes encode by hand to what encoding/json writes, and the hand
// encoder takes the everyday ones.
func TestDeltaJSONMatchesEncodingJSON(t *testing.T) {
	now := time.Now().UTC()
	raws := []json.RawMessage{
		nil, json.RawMessage(`"a title"`), json.RawMessage(`{"a":[1,2.5,true,null]}`), json.RawMessage(`{ "spaced": 1 }`),
		json.RawMessage(`"<b>&"`), json.RawMessage("\"\u2028\""), json.RawMessage(`{"unterminated"`), json.RawMessage(``),
		json.RawMessage("[\n1]"), json.RawMessage(`12345678901234567890`),
	}
	strs := []string{"", "plain", "<html> & \u2029", "é \xff \x01 \"q\" \\"}
	msgs := []model.Message{
		{ID: "m1", Role: model.RoleUser, Content: "hi"},
		{ID: "m2", Role: model.RoleAssistant, Content: "ok", Meta: map[string]any{"finish_reason": "stop", "run_id": "r1",
			"usage": map[string]any{"input_tokens": 10, "output_tokens": 2, "approximate": true, "model": "gpt"}}},
		{ID: "m3", Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "c1", Name: "ls", Arguments: `{"path":"/"}`}}},
		{ID: "m4", Role: model.RoleTool, ToolCallID: "c1", Name: "ls", Content: "a\nb", Status: "success"},
		{ID: "m5", Role: model.RoleUser, Meta: map[string]any{"odd": struct{ X int }{1}}},
	}
	times := []time.Time{now, {}, time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), now.In(time.FixedZone("x", 3600))}
	rnd := rand.New(rand.NewPCG(1, 2))
	hand := 0
	const n = 3000
	for i := range n {
		d := &Delta{ID: fmt.Sprintf("e1-%d", i), RunID: strs[rnd.IntN(len(strs))], Step: rnd.IntN(5) - 1, Time: times[rnd.IntN(len(times))]}
		if rnd.IntN(2) == 0 {
			d.Parent = strs[rnd.IntN(len(strs))]
		}
		for range rnd.IntN(3) {
			d.Update.Messages = append(d.Update.Messages, msgs[rnd.IntN(len(msgs))])
		}
		if rnd.IntN(3) == 0 {
			d.Update.Remove = []string{strs[rnd.IntN(len(strs))], "m1"}
		}
		if rnd.IntN(2) == 0 {
			d.Update.Values = map[string]json.RawMessage{}
			for range 1 + rnd.IntN(3) {
				d.Update.Values[strs[rnd.IntN(len(strs))]] = raws[rnd.IntN(len(raws))]
			}
		}
		if rnd.IntN(4) == 0 {
			d.Source, d.AsNode, d.Replaced, d.At = strs[rnd.IntN(len(strs))], strs[rnd.IntN(len(strs))], strs[rnd.IntN(len(strs))], strs[rnd.IntN(len(strs))]
		}
		if rnd.IntN(10) == 0 {
			d.Files = []files.Change{{Path: "a.txt"}}
		}
		want, wantErr := json.Marshal(d)
		got, err := encodeDelta(d)
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("delta %+v: error %v, encoding/json says %v", d, err, wantErr)
		}
		if err == nil && !bytes.Equal(got, want) {
			t.Fatalf("hand-encoded delta differs from encoding/json:\n got %s\nwant %s", got, want)
		}
		if _, ok := appendDelta(nil, d); ok {
			hand++
		}
	}
	if hand < n/4 {
		t.Fatalf("the hand encoder wrote only %d of %d deltas", hand, n)
	}
	everyday := &Delta{ID: "e1-1", RunID: "r1", Step: 1, Time: now, Update: state.Update{Messages: msgs[:2],
		Values: map[string]json.RawMessage{"title": json.RawMessage(`"hi"`)}}}
	if _, ok := appendDelta(nil, everyday); !ok {
		t.Fatal("a run's checkpoint fell back to encoding/json")
	}
}
