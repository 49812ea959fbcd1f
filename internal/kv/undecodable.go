package kv

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/metrics"
)

// Skips reports the records of one bucket that a listing or a search
// skips because they do not decode. A nil *Skips reports nothing.
type Skips struct {
	bucket string
	log    *zap.Logger
	rec    metrics.Recorder
}

// NewSkips reports the records of bucket that listings skip because they
// do not decode: counted in rec (RecordUndecodable, by bucket) every
// time, and logged to log as a warning once per key per process, at most
// undecodableLines lines a minute, with the bucket, the key and what is
// wrong, never the value. Give it to List.
func NewSkips(bucket string, log *zap.Logger, rec metrics.Recorder) *Skips {
	if log == nil {
		log = zap.NewNop()
	}
	return &Skips{bucket: bucket, log: log, rec: metrics.Or(rec)}
}

// Observe makes the run and thread stores report each record their
// listings and searches skip because it does not decode (NewSkips).
// Without it they skip such records silently.
func (s *Stores) Observe(log *zap.Logger, rec metrics.Recorder) {
	s.Runs.skips = NewSkips(s.Runs.bucket, log, rec)
	s.Threads.skips = NewSkips(s.Threads.bucket, log, rec)
}

// Observe makes the assistants store report each record its listings
// skip because it does not decode (NewSkips). Without it they skip such
// records silently.
func (s *Assistants) Observe(log *zap.Logger, rec metrics.Recorder) {
	s.skips = NewSkips(s.kv.Bucket(), log, rec)
}

// skip reports the record at key, which did not decode.
func (s *Skips) skip(key string, err error) {
	if s == nil {
		return
	}
	s.rec.RecordUndecodable(s.bucket)
	if undecodable.first(s.bucket, key, time.Now()) {
		s.log.Warn("a stored record does not decode; listings and searches leave it out: repair or delete the key (it may be corrupted, or written by a newer version)",
			zap.String("bucket", s.bucket), zap.String("key", key), zap.String("fault", decodeFault(err)))
	}
}

// undecodable is the process's memory of the keys it logged: a key is
// logged once however often listings skip it, and the lines are bounded
// per minute however many keys are bad. A key not logged for the bound
// is logged at a later skip.
var undecodable = &undecodableLog{logged: map[string]struct{}{}}

// Bounds of undecodableLog: the keys remembered (past it the memory
// starts again) and the lines a minute.
const (
	undecodableKeys  = 10000
	undecodableLines = 10
)

type undecodableLog struct {
	mu     sync.Mutex
	logged map[string]struct{}
	minute time.Time // the start of the minute lines counts
	lines  int
}

// first reports whether the key of bucket should be logged now.
func (l *undecodableLog) first(bucket, key string, now time.Time) bool {
	k := bucket + "." + key
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.logged[k]; ok {
		return false
	}
	if now.Sub(l.minute) >= time.Minute {
		l.minute, l.lines = now, 0
	}
	if l.lines >= undecodableLines {
		return false
	}
	if len(l.logged) >= undecodableKeys {
		clear(l.logged)
	}
	l.logged[k] = struct{}{}
	l.lines++
	return true
}

// decodeFault describes a decode error without the value's text: a JSON
// syntax error by its offset, a type mismatch by its field and types;
// any other (a malformed time, a custom decoder's) may quote the value,
// so it is named by its type only.
func decodeFault(err error) string {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return fmt.Sprintf("invalid JSON at byte %d", syntax.Offset)
	case errors.As(err, &typ):
		// Value is the JSON's kind, and a number's digits: the kind only.
		kind, _, _ := strings.Cut(typ.Value, " ")
		return fmt.Sprintf("field %q holds a JSON %s, not a %s", typ.Field, kind, typ.Type)
	case errors.Is(err, errNoThreadID):
		return err.Error()
	}
	return fmt.Sprintf("a value that does not decode (%T)", err)
}
