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
			if !reflect.DeepEqual(seq, once) {
				t.Fatalf("sequential %+v\nmerged     %+v", seq, once)
			}
		})
	}
}
