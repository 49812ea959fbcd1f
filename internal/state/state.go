// Package state owns the state of a thread as the agent loop and the
// middleware chain see it: the transcript (messages upserted and removed by
// id) and named values that middlewares keep (todos, activated skills...).
// It also defines the delta a checkpoint stores, so a checkpoint grows with
// what a step changed, not with the whole history. It does no I/O.
package state

import (
	"bytes"
	"encoding/json"
	"maps"

	"github.com/natsagent/natsagent/internal/model"
)

// State is a thread's state at one point.
type State struct {
	Messages []model.Message            `json:"messages"`
	Values   map[string]json.RawMessage `json:"values,omitempty"`
}

// Clone deep-copies s.
func (s *State) Clone() *State {
	c := &State{Messages: model.CloneMessages(s.Messages)}
	if s.Values != nil {
		c.Values = maps.Clone(s.Values)
	}
	return c
}

// Index returns the position of the message with the given id, or -1.
func (s *State) Index(id string) int {
	if id == "" {
		return -1
	}
	for i := len(s.Messages) - 1; i >= 0; i-- {
		if s.Messages[i].ID == id {
			return i
		}
	}
	return -1
}

// Update is a change to a state: messages upserted by id (a message whose
// id exists replaces it in place, others are appended), messages removed by
// id, and values set (a JSON null deletes the value).
type Update struct {
	Messages []model.Message            `json:"messages,omitempty"`
	Remove   []string                   `json:"remove,omitempty"`
	Values   map[string]json.RawMessage `json:"values,omitempty"`
}

// Empty reports whether u changes nothing.
func (u *Update) Empty() bool {
	return u == nil || (len(u.Messages) == 0 && len(u.Remove) == 0 && len(u.Values) == 0)
}

// Merge appends o's changes after u's, so that applying u then o and
// applying the merged update give the same state. Apply removes before it
// upserts, so a message u upserts and o removes is dropped from u here,
// or the merged update would bring it back.
func (u *Update) Merge(o Update) {
	if len(o.Remove) > 0 && len(u.Messages) > 0 {
		drop := make(map[string]bool, len(o.Remove))
		for _, id := range o.Remove {
			drop[id] = true
		}
		kept := u.Messages[:0:0]
		for _, m := range u.Messages {
			if !drop[m.ID] {
				kept = append(kept, m)
			}
		}
		u.Messages = kept
	}
	u.Messages = append(u.Messages, o.Messages...)
	u.Remove = append(u.Remove, o.Remove...)
	for k, v := range o.Values {
		if u.Values == nil {
			u.Values = make(map[string]json.RawMessage)
		}
		u.Values[k] = v
	}
}

var jsonNull = []byte("null")

// Apply applies u to s in place. Removals happen before upserts, so an
// update can remove a message and add its replacement under a new id.
func (s *State) Apply(u Update) {
	if len(u.Remove) > 0 {
		drop := make(map[string]bool, len(u.Remove))
		for _, id := range u.Remove {
			drop[id] = true
		}
		kept := s.Messages[:0]
		for _, m := range s.Messages {
			if !drop[m.ID] {
				kept = append(kept, m)
			}
		}
		s.Messages = kept
	}
	for _, m := range u.Messages {
		if i := s.Index(m.ID); i >= 0 {
			s.Messages[i] = m
		} else {
			s.Messages = append(s.Messages, m)
		}
	}
	for k, v := range u.Values {
		if len(v) == 0 || bytes.Equal(v, jsonNull) {
			delete(s.Values, k)
			continue
		}
		if s.Values == nil {
			s.Values = make(map[string]json.RawMessage)
		}
		s.Values[k] = v
	}
}

// Value decodes the named value into v; it reports false when absent.
func (s *State) Value(name string, v any) (bool, error) {
	raw, ok := s.Values[name]
	if !ok {
		return false, nil
	}
	return true, json.Unmarshal(raw, v)
}

// SetValue encodes v into an update for the named value.
func SetValue(name string, v any) (Update, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return Update{}, err
	}
	return Update{Values: map[string]json.RawMessage{name: raw}}, nil
}
