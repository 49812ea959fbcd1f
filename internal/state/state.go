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

	// index maps message ids to positions for the first indexLen
	// messages; it is rebuilt when Messages grew behind its back.
	index    map[string]int
	indexLen int
	// rewrites counts changes to existing messages (replacements and
	// removals); appends do not count. Caches of a validated transcript
	// prefix stay valid while it is unchanged.
	rewrites uint64
}

// Rewrites returns how many times an existing message was replaced or
// removed through Apply.
func (s *State) Rewrites() uint64 { return s.rewrites }

// Clone deep-copies s.
func (s *State) Clone() *State {
	c := &State{Messages: model.CloneMessages(s.Messages), rewrites: s.rewrites}
	if s.index != nil && s.indexLen == len(s.Messages) {
		c.index, c.indexLen = maps.Clone(s.index), s.indexLen
	}
	if s.Values != nil {
		c.Values = maps.Clone(s.Values)
	}
	return c
}

// scanned is the length up to which Index looks through the transcript
// instead of building its map: a few comparisons cost less than the map,
// which a run on a new thread would hold while it waits on its model.
const scanned = 8

// Index returns the position of the message with the given id, or -1. It
// does not scan a long transcript: the cost of a step stays flat in the
// thread's length.
func (s *State) Index(id string) int {
	if id == "" {
		return -1
	}
	if s.index == nil && len(s.Messages) <= scanned {
		for i := len(s.Messages) - 1; i >= 0; i-- {
			if s.Messages[i].ID == id {
				return i // the last, as the map keeps a later duplicate
			}
		}
		return -1
	}
	if s.index == nil || s.indexLen != len(s.Messages) {
		s.reindex()
	}
	if i, ok := s.index[id]; ok && i < len(s.Messages) && s.Messages[i].ID == id {
		return i
	}
	return -1
}

func (s *State) reindex() {
	s.index = make(map[string]int, len(s.Messages))
	for i, m := range s.Messages {
		if m.ID != "" {
			s.index[m.ID] = i // a later duplicate wins, as upserts find the last
		}
	}
	s.indexLen = len(s.Messages)
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
		if len(kept) != len(s.Messages) {
			s.rewrites++
			s.index = nil
		}
		s.Messages = kept
	}
	for _, m := range u.Messages {
		if i := s.Index(m.ID); i >= 0 {
			s.Messages[i] = m
			s.rewrites++
			continue
		}
		s.Messages = append(s.Messages, m)
		if s.index != nil && s.indexLen == len(s.Messages)-1 {
			if m.ID != "" {
				s.index[m.ID] = len(s.Messages) - 1
			}
			s.indexLen++
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
