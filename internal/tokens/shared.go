package tokens

import (
	"hash/maphash"
	"sync"

	"github.com/natsagent/natsagent/internal/model"
)

// SharedCacheSize bounds the message counts the process-wide level keeps
// per encoding (about 100 bytes each, ids included; no text).
const SharedCacheSize = 1 << 16

// sharedCache is the process-wide level behind every Cache of one
// encoding: counts keyed by message id, size and a 64-bit hash of the sent
// fields, and tool schemas keyed by name and hash. Two different messages would have to agree on id, size and hash
// to share a count.
type sharedCache struct {
	seed maphash.Seed
	half int

	mu       sync.Mutex
	cur, old map[sharedKey]int
}

type sharedKey struct {
	id   string
	size int
	sum  uint64
}

var shared sync.Map // encoding -> *sharedCache

func sharedFor(encoding string) *sharedCache {
	if v, ok := shared.Load(encoding); ok {
		return v.(*sharedCache)
	}
	v, _ := shared.LoadOrStore(encoding, &sharedCache{seed: maphash.MakeSeed(), half: SharedCacheSize / 2, cur: make(map[sharedKey]int)})
	return v.(*sharedCache)
}

// sum hashes the fields of m a model sees.
func (s *sharedCache) sum(m *model.Message) uint64 {
	var h maphash.Hash
	h.SetSeed(s.seed)
	field := func(v string) {
		h.WriteString(v)
		h.WriteByte(0)
	}
	field(m.Role)
	field(m.Content)
	field(m.Name)
	field(m.ToolCallID)
	for i := range m.ToolCalls {
		field(m.ToolCalls[i].ID)
		field(m.ToolCalls[i].Name)
		field(m.ToolCalls[i].Arguments)
	}
	return h.Sum64()
}

// textSum hashes a text (a system prompt; its key's id is one no message
// has).
func (s *sharedCache) textSum(text string) uint64 { return maphash.String(s.seed, text) }

// toolSum hashes a tool schema; its keys have a negative size, so they
// never meet a message's.
func (s *sharedCache) toolSum(t *model.ToolSpec) uint64 {
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteString(t.Name)
	h.WriteByte(0)
	h.WriteString(t.Description)
	h.WriteByte(0)
	h.Write(t.Parameters)
	return h.Sum64()
}

func (s *sharedCache) get(k sharedKey) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.cur[k]
	if !ok {
		if n, ok = s.old[k]; ok {
			s.putLocked(k, n)
		}
	}
	return n, ok
}

func (s *sharedCache) put(k sharedKey, n int) {
	s.mu.Lock()
	s.putLocked(k, n)
	s.mu.Unlock()
}

func (s *sharedCache) putLocked(k sharedKey, n int) {
	if _, there := s.cur[k]; !there && len(s.cur) >= s.half {
		s.old = s.cur
		s.cur = make(map[sharedKey]int, s.half)
	}
	s.cur[k] = n
}
