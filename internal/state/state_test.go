package state

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
)

func msg(id, content string) model.Message {
	return model.Message{ID: id, Role: model.RoleUser, Content: content}
}

func TestApplyUpsertsRemovesAndSetsValues(t *testing.T) {
	st := &State{Messages: []model.Message{msg("a", "1"), msg("b", "2")}}
	st.Apply(Update{
		Messages: []model.Message{msg("a", "1 edited"), msg("c", "3")},
		Remove:   []string{"b"},
		Values:   map[string]json.RawMessage{"todos": json.RawMessage(`[1]`)},
	})
	want := []model.Message{msg("a", "1 edited"), msg("c", "3")}
	if !reflect.DeepEqual(st.Messages, want) {
		t.Fatalf("messages %+v", st.Messages)
	}
	var todos []int
	if ok, err := st.Value("todos", &todos); !ok || err != nil || len(todos) != 1 {
		t.Fatalf("value %v %v %v", ok, err, todos)
	}
	st.Apply(Update{Values: map[string]json.RawMessage{"todos": json.RawMessage(`null`)}})
	if _, ok := st.Values["todos"]; ok {
		t.Fatal("a null value must delete it")
	}
}

// Applying a merged update must equal applying its parts in order, for
// every interleaving of upserts and removals of one id.
func TestMergeReplaysLikeSequentialApply(t *testing.T) {
	cases := map[string][]Update{
		"add then remove":        {{Messages: []model.Message{msg("x", "new")}}, {Remove: []string{"x"}}},
		"replace then remove":    {{Messages: []model.Message{msg("a", "edited")}}, {Remove: []string{"a"}}},
		"remove then add back":   {{Remove: []string{"a"}}, {Messages: []model.Message{msg("a", "back")}}},
		"remove and re-add":      {{Messages: []model.Message{msg("a", "v2")}}, {Remove: []string{"a"}, Messages: []model.Message{msg("a", "v3")}}},
		"values overwrite":       {{Values: map[string]json.RawMessage{"k": json.RawMessage(`1`)}}, {Values: map[string]json.RawMessage{"k": json.RawMessage(`2`)}}},
		"three steps with a gap": {{Messages: []model.Message{msg("y", "1")}}, {Messages: []model.Message{msg("z", "2")}}, {Remove: []string{"y"}}},
	}
	for name, parts := range cases {
		t.Run(name, func(t *testing.T) {
			base := func() *State { return &State{Messages: []model.Message{msg("a", "orig"), msg("b", "keep")}} }
			seq := base()
			var merged Update
			for _, u := range parts {
				seq.Apply(u)
				merged.Merge(u)
			}
			once := base()
			once.Apply(merged)
			if !reflect.DeepEqual(seq.Messages, once.Messages) || !reflect.DeepEqual(seq.Values, once.Values) {
				t.Fatalf("sequential %+v\nmerged     %+v", seq, once)
			}
		})
	}
}

// Index stays right through appends, replacements and removals, and after
// messages were appended to the slice directly.
func TestIndex(t *testing.T) {
	st := &State{}
	st.Apply(Update{Messages: []model.Message{msg("a", "1"), msg("b", "2"), msg("c", "3")}})
	if st.Index("b") != 1 || st.Index("nope") != -1 || st.Index("") != -1 {
		t.Fatal("index after appends")
	}
	before := st.Rewrites()
	st.Apply(Update{Messages: []model.Message{msg("d", "4")}})
	if st.Rewrites() != before {
		t.Fatal("an append counted as a rewrite")
	}
	st.Apply(Update{Remove: []string{"a"}})
	if st.Index("b") != 0 || st.Index("d") != 2 || st.Rewrites() != before+1 {
		t.Fatalf("index after removal: b=%d d=%d", st.Index("b"), st.Index("d"))
	}
	st.Apply(Update{Messages: []model.Message{msg("c", "3 edited")}})
	if st.Messages[1].Content != "3 edited" || st.Rewrites() != before+2 {
		t.Fatal("replacement")
	}
	st.Messages = append(st.Messages, msg("e", "5"))
	if st.Index("e") != 3 {
		t.Fatal("a message appended directly was not found")
	}
}

// A short transcript is searched, not mapped (a run on a new thread holds
// no map while it waits); past the limit the map takes over, and both
// find the last of two messages with one id, as an upsert does.
func TestIndex_ShortTranscriptHasNoMap(t *testing.T) {
	st := &State{Messages: []model.Message{msg("a", "1"), msg("b", "2"), msg("a", "3")}}
	if st.Index("a") != 2 || st.Index("b") != 1 || st.Index("x") != -1 {
		t.Fatalf("short: a=%d b=%d x=%d", st.Index("a"), st.Index("b"), st.Index("x"))
	}
	st.Apply(Update{Messages: []model.Message{msg("b", "2 edited"), msg("c", "4")}})
	if st.index != nil {
		t.Error("a transcript of 4 messages built the index map")
	}
	if st.Messages[1].Content != "2 edited" || len(st.Messages) != 4 {
		t.Fatalf("upsert on a short transcript: %+v", st.Messages)
	}
	for i := range scanned {
		st.Apply(Update{Messages: []model.Message{msg(string(rune('k'+i)), "n")}})
	}
	if got := st.Index(string(rune('k' + scanned - 1))); got != len(st.Messages)-1 || st.index == nil {
		t.Errorf("long: index %d of %d, map built %v", got, len(st.Messages), st.index != nil)
	}
	if st.Index("a") != 2 {
		t.Errorf("long: a=%d, want the later duplicate 2", st.Index("a"))
	}
	st.Apply(Update{Remove: []string{"k", "l", "m", "n", "o", "p", "q", "r"}})
	if st.Index("c") != 3 || st.Index("k") != -1 {
		t.Errorf("after removals: c=%d k=%d", st.Index("c"), st.Index("k"))
	}
}
