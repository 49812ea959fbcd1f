package protocol

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/natsagent/natsagent/internal/model"
)

// The run and thread records are written several times in every run (a
// no-op run writes the run record twice and the thread record twice), so
// they are encoded by hand, as events.AppendEnvelope encodes the event
// envelope: encoding/json spends most of its time in reflection and in
// validating what it just wrote.
//
// The bytes are exactly those of json.Marshal: the same field order,
// omitempty and omitzero, RFC 3339 times with nanoseconds, and the same
// escaping (HTML characters and U+2028/U+2029 included), so what is stored
// does not change. TestRecordJSONMatchesEncodingJSON and FuzzRecordJSON
// hold the two together, every field included: a field added to a record
// and not here fails them. What the hand encoder does not know (a Go type
// other than JSON's own in metadata, a time json.Marshal refuses, an
// invalid json.Number) makes it hand the whole record to json.Marshal, so
// the output and the errors stay those of encoding/json there too.

// AppendRunJSON appends the JSON of a run record to b, byte for byte what
// json.Marshal(r) writes.
func AppendRunJSON(b []byte, r *Run) ([]byte, error) {
	if out, ok := appendRun(b, r); ok {
		return out, nil
	}
	return appendMarshal(b, r)
}

// AppendThreadJSON appends the JSON of a thread record to b, byte for
// byte what json.Marshal(t) writes.
func AppendThreadJSON(b []byte, t *Thread) ([]byte, error) {
	if out, ok := appendThread(b, t); ok {
		return out, nil
	}
	return appendMarshal(b, t)
}

// AppendEventDataJSON appends the JSON of an event's data (StartedData,
// QueuedData, FinishedData, a model.Message as message.completed carries,
// by value or pointer, or an EventDataAppender), byte for byte what
// json.Marshal(data) writes. ok is false for any other type, or a value
// the hand encoder does not know (see above): the caller then uses
// encoding/json, and b may hold a partial write to cut off.
func AppendEventDataJSON(b []byte, data any) (out []byte, ok bool) {
	switch d := data.(type) {
	case model.Message:
		return appendMessage(b, &d)
	case *model.Message:
		if d != nil {
			return appendMessage(b, d)
		}
	case EventDataAppender:
		return d.AppendEventDataJSON(b)
	case StartedData:
		return appendStartedData(b, &d)
	case *StartedData:
		if d != nil {
			return appendStartedData(b, d)
		}
	case QueuedData:
		return appendQueuedData(b, &d), true
	case *QueuedData:
		if d != nil {
			return appendQueuedData(b, d), true
		}
	case FinishedData:
		return appendFinishedData(b, &d)
	case *FinishedData:
		if d != nil {
			return appendFinishedData(b, d)
		}
	}
	return b, false
}

// EventDataAppender is event data that encodes itself by hand (a
// middleware's small event), byte for byte what json.Marshal writes, or
// reports false to have encoding/json do it.
type EventDataAppender interface {
	AppendEventDataJSON(b []byte) ([]byte, bool)
}

// AppendMessageJSON appends m as encoding/json writes it, or reports
// false (b then may hold a partial write) for a value the hand encoder
// does not know: the caller uses encoding/json.
func AppendMessageJSON(b []byte, m *model.Message) ([]byte, bool) { return appendMessage(b, m) }

// AppendTimeJSON appends t as encoding/json writes it, or reports false
// for a time it refuses (a year beyond 9999, an odd zone).
func AppendTimeJSON(b []byte, t time.Time) ([]byte, bool) { return appendTime(b, t) }

// AppendStringsJSON appends ss as encoding/json writes it.
func AppendStringsJSON(b []byte, ss []string) []byte { return appendStrings(b, ss) }

// AppendJSONString appends s as a JSON string, as encoding/json writes it
// (HTML characters and U+2028/9 escaped, invalid UTF-8 replaced).
func AppendJSONString(b []byte, s string) []byte { return appendJSONString(b, s) }

func appendStartedData(b []byte, d *StartedData) ([]byte, bool) {
	ok := true
	b = append(b, `{"attempt":`...)
	b = strconv.AppendInt(b, int64(d.Attempt), 10)
	b = append(b, `,"worker":`...)
	b = appendJSONString(b, d.Worker)
	b = append(b, `,"agent":`...)
	b = appendJSONString(b, d.Agent)
	b = appendOptString(b, `,"multitask_strategy":`, d.MultitaskStrategy)
	if d.QueuedAt != nil {
		b = append(b, `,"queued_at":`...)
		if b, ok = appendTime(b, *d.QueuedAt); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

func appendQueuedData(b []byte, d *QueuedData) []byte {
	b = append(b, `{"agent":`...)
	b = appendJSONString(b, d.Agent)
	b = append(b, `,"multitask_strategy":`...)
	b = appendJSONString(b, d.MultitaskStrategy)
	return append(b, '}')
}

func appendFinishedData(b []byte, d *FinishedData) ([]byte, bool) {
	ok := true
	b = append(b, `{"status":`...)
	b = appendJSONString(b, string(d.Status))
	b = appendOptString(b, `,"stop_reason":`, d.StopReason)
	b = appendIncomplete(b, d.IncompleteDetails)
	b = appendOptString(b, `,"error":`, d.Error)
	if d.Output != nil {
		b = append(b, `,"output":`...)
		if b, ok = appendMessage(b, d.Output); !ok {
			return b, false
		}
	}
	b = appendOptString(b, `,"superseded_by":`, d.SupersededBy)
	if d.Interrupt != nil {
		b = append(b, `,"interrupt":`...)
		b = appendInterrupt(b, d.Interrupt)
	}
	return append(b, '}'), true
}

func appendIncomplete(b []byte, d *IncompleteDetails) []byte {
	if d == nil {
		return b
	}
	b = append(b, `,"incomplete_details":{"reason":`...)
	b = appendJSONString(b, d.Reason)
	return append(b, '}')
}

func appendMarshal(b []byte, v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return b, err
	}
	return append(b, data...), nil
}

func appendRun(b []byte, r *Run) ([]byte, bool) {
	ok := true
	b = append(b, `{"run_id":`...)
	b = appendJSONString(b, r.RunID)
	b = append(b, `,"thread_id":`...)
	b = appendJSONString(b, r.ThreadID)
	b = append(b, `,"tenant":`...)
	b = appendJSONString(b, r.Tenant)
	b = append(b, `,"agent":`...)
	b = appendJSONString(b, r.Agent)
	b = append(b, `,"status":`...)
	b = appendJSONString(b, string(r.Status))
	b = appendOptString(b, `,"multitask_strategy":`, r.MultitaskStrategy)
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(r.Attempt), 10)
	b = append(b, `,"created_at":`...)
	if b, ok = appendTime(b, r.CreatedAt); !ok {
		return b, false
	}
	if r.StartedAt != nil {
		b = append(b, `,"started_at":`...)
		if b, ok = appendTime(b, *r.StartedAt); !ok {
			return b, false
		}
	}
	if r.FinishedAt != nil {
		b = append(b, `,"finished_at":`...)
		if b, ok = appendTime(b, *r.FinishedAt); !ok {
			return b, false
		}
	}
	b = appendOptString(b, `,"stop_reason":`, r.StopReason)
	b = appendIncomplete(b, r.IncompleteDetails)
	b = appendOptString(b, `,"error":`, r.Error)
	if r.Output != nil {
		b = append(b, `,"output":`...)
		if b, ok = appendMessage(b, r.Output); !ok {
			return b, false
		}
	}
	b = appendOptString(b, `,"output_checkpoint":`, r.OutputCheckpoint)
	if r.Parent != nil {
		b = append(b, `,"parent":{"run_id":`...)
		b = appendJSONString(b, r.Parent.RunID)
		b = append(b, `,"thread_id":`...)
		b = appendJSONString(b, r.Parent.ThreadID)
		b = append(b, `,"tool_call_id":`...)
		b = appendJSONString(b, r.Parent.ToolCallID)
		b = append(b, '}')
	}
	if len(r.Metadata) > 0 {
		b = append(b, `,"metadata":`...)
		if b, ok = appendObject(b, r.Metadata); !ok {
			return b, false
		}
	}
	b = appendOptString(b, `,"superseded_by":`, r.SupersededBy)
	if r.Interrupt != nil {
		b = append(b, `,"interrupt":`...)
		b = appendInterrupt(b, r.Interrupt)
	}
	if r.Usage != nil {
		b = append(b, `,"usage":`...)
		if b, ok = appendRunUsage(b, r.Usage); !ok {
			return b, false
		}
	}
	b = appendOptString(b, `,"worker":`, r.Worker)
	b = appendOptUint(b, `,"epoch":`, r.Epoch)
	b = appendOptUint(b, `,"msg_seq":`, r.MsgSeq)
	b = appendOptString(b, `,"base_checkpoint":`, r.BaseCheckpoint)
	b = appendOptUint(b, `,"seq":`, r.Seq)
	if r.CancelRequested {
		b = append(b, `,"cancel_requested":true`...)
	}
	b = appendOptUint(b, `,"finished_event_id":`, r.FinishedEventID)
	if r.Webhook != nil {
		// Rare (runs that asked for a webhook): encoding/json.
		b = append(b, `,"webhook":`...)
		var err error
		if b, err = appendMarshal(b, r.Webhook); err != nil {
			return b, false
		}
	}
	if len(r.StreamMode) > 0 {
		b = append(b, `,"stream_mode":`...)
		b = appendStrings(b, r.StreamMode)
	}
	return append(b, '}'), true
}

func appendThread(b []byte, t *Thread) ([]byte, bool) {
	ok := true
	b = append(b, `{"thread_id":`...)
	b = appendJSONString(b, t.ThreadID)
	b = append(b, `,"tenant":`...)
	b = appendJSONString(b, t.Tenant)
	b = append(b, `,"created_at":`...)
	if b, ok = appendTime(b, t.CreatedAt); !ok {
		return b, false
	}
	b = append(b, `,"updated_at":`...)
	if b, ok = appendTime(b, t.UpdatedAt); !ok {
		return b, false
	}
	b = append(b, `,"status":`...)
	b = appendJSONString(b, t.Status)
	if len(t.Metadata) > 0 {
		b = append(b, `,"metadata":`...)
		if b, ok = appendObject(b, t.Metadata); !ok {
			return b, false
		}
	}
	b = appendOptString(b, `,"title":`, t.Title)
	b = appendOptString(b, `,"head":`, t.Head)
	b = appendOptString(b, `,"files_at":`, t.FilesAt)
	b = append(b, `,"epoch":`...)
	b = strconv.AppendUint(b, t.Epoch, 10)
	if l := t.Lease; l != nil {
		b = append(b, `,"lease":{"run_id":`...)
		b = appendJSONString(b, l.RunID)
		b = append(b, `,"worker":`...)
		b = appendJSONString(b, l.Worker)
		b = append(b, `,"epoch":`...)
		b = strconv.AppendUint(b, l.Epoch, 10)
		b = append(b, `,"msg_seq":`...)
		b = strconv.AppendUint(b, l.MsgSeq, 10)
		b = append(b, `,"acquired_at":`...)
		if b, ok = appendTime(b, l.AcquiredAt); !ok {
			return b, false
		}
		b = append(b, `,"renewed_at":`...)
		if b, ok = appendTime(b, l.RenewedAt); !ok {
			return b, false
		}
		if l.HandedOver {
			b = append(b, `,"handed_over":true`...)
		}
		if l.Tentative {
			b = append(b, `,"tentative":true`...)
		}
		if l.Attempt != 0 {
			b = append(b, `,"attempt":`...)
			b = strconv.AppendInt(b, int64(l.Attempt), 10)
		}
		b = appendOptString(b, `,"agent":`, l.Agent)
		b = appendOptString(b, `,"base_checkpoint":`, l.BaseCheckpoint)
		if l.CreatedAt != nil {
			b = append(b, `,"created_at":`...)
			if b, ok = appendTime(b, *l.CreatedAt); !ok {
				return b, false
			}
		}
		b = append(b, '}')
	}
	if len(t.Preempt) > 0 {
		b = append(b, `,"preempt":[`...)
		for i, p := range t.Preempt {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"run_id":`...)
			b = appendJSONString(b, p.RunID)
			b = append(b, `,"strategy":`...)
			b = appendJSONString(b, p.Strategy)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	b = appendOptString(b, `,"last_run_id":`, t.LastRunID)
	b = appendOptString(b, `,"owner":`, t.Owner)
	if t.Usage != nil {
		b = append(b, `,"usage":`...)
		if b, ok = appendThreadUsage(b, t.Usage); !ok {
			return b, false
		}
	}
	if len(t.RecentRuns) > 0 {
		b = append(b, `,"recent_runs":`...)
		b = appendStrings(b, t.RecentRuns)
	}
	if t.LastRun != nil {
		b = append(b, `,"last_run":`...)
		if b, ok = appendRun(b, t.LastRun); !ok {
			return b, false
		}
	}
	if len(t.CancelledRuns) > 0 {
		b = append(b, `,"cancelled_runs":`...)
		b = appendStrings(b, t.CancelledRuns)
	}
	return append(b, '}'), true
}

func appendThreadUsage(b []byte, u *ThreadUsage) ([]byte, bool) {
	b = append(b, `{"thread_id":`...)
	b = appendJSONString(b, u.ThreadID)
	b = append(b, `,"tenant":`...)
	b = appendJSONString(b, u.Tenant)
	b = append(b, `,"total":`...)
	b = appendUsageTotals(b, &u.Total)
	if len(u.Runs) > 0 {
		b = append(b, `,"runs":{`...)
		var buf [8]string
		for i, k := range sortedKeys(u.Runs, buf[:0]) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			e := u.Runs[k]
			b = append(b, `:{"usage":`...)
			b = appendUsageTotals(b, &e.Usage)
			b = append(b, `,"seq":`...)
			b = strconv.AppendUint(b, e.Seq, 10)
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	if !usageTotalsZero(&u.Folded) {
		b = append(b, `,"folded":`...)
		b = appendUsageTotals(b, &u.Folded)
	}
	if u.FoldedRuns != 0 {
		b = append(b, `,"folded_runs":`...)
		b = strconv.AppendInt(b, int64(u.FoldedRuns), 10)
	}
	b = append(b, `,"applied":`...)
	b = strconv.AppendUint(b, u.Applied, 10)
	if !u.UpdatedAt.IsZero() {
		var ok bool
		b = append(b, `,"updated_at":`...)
		if b, ok = appendTime(b, u.UpdatedAt); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

// usageTotalsZero is what omitzero tests of a UsageTotals.
func usageTotalsZero(u *UsageTotals) bool {
	return tokenCountsZero(&u.TokenCounts) && tokenCountsZero(&u.Main) && tokenCountsZero(&u.Summary) && u.Models == nil
}

func appendMessage(b []byte, m *model.Message) ([]byte, bool) {
	b = append(b, '{')
	if m.ID != "" {
		b = append(b, `"id":`...)
		b = appendJSONString(b, m.ID)
		b = append(b, ',')
	}
	b = append(b, `"role":`...)
	b = appendJSONString(b, m.Role)
	b = append(b, `,"content":`...)
	b = appendJSONString(b, m.Content)
	b = appendOptString(b, `,"name":`, m.Name)
	if len(m.ToolCalls) > 0 {
		b = append(b, `,"tool_calls":[`...)
		for i, c := range m.ToolCalls {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"id":`...)
			b = appendJSONString(b, c.ID)
			b = append(b, `,"name":`...)
			b = appendJSONString(b, c.Name)
			b = append(b, `,"arguments":`...)
			b = appendJSONString(b, c.Arguments)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	b = appendOptString(b, `,"tool_call_id":`, m.ToolCallID)
	b = appendOptString(b, `,"status":`, m.Status)
	if len(m.Parts) > 0 {
		b = append(b, `,"parts":[`...)
		for i, p := range m.Parts {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"type":`...)
			b = appendJSONString(b, p.Type)
			b = appendOptString(b, `,"text":`, p.Text)
			b = appendOptString(b, `,"image_url":`, p.ImageURL)
			if img := p.Image; img != nil {
				b = append(b, `,"image_file":{"sha256":`...)
				b = appendJSONString(b, img.SHA256)
				b = append(b, `,"mime_type":`...)
				b = appendJSONString(b, img.MIME)
				if img.Size != 0 {
					b = append(b, `,"size":`...)
					b = strconv.AppendInt(b, img.Size, 10)
				}
				b = append(b, '}')
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if len(m.Meta) > 0 {
		var ok bool
		b = append(b, `,"meta":`...)
		if b, ok = appendObject(b, m.Meta); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

func appendInterrupt(b []byte, in *Interrupt) []byte {
	b = append(b, `{"kind":`...)
	b = appendJSONString(b, in.Kind)
	b = append(b, `,"run_id":`...)
	b = appendJSONString(b, in.RunID)
	b = appendOptString(b, `,"message_id":`, in.MessageID)
	if len(in.ActionRequests) > 0 {
		b = append(b, `,"action_requests":[`...)
		for i, a := range in.ActionRequests {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"tool_call_id":`...)
			b = appendJSONString(b, a.ToolCallID)
			b = append(b, `,"name":`...)
			b = appendJSONString(b, a.Name)
			b = append(b, `,"arguments":`...)
			b = appendJSONString(b, a.Arguments)
			b = appendOptString(b, `,"description":`, a.Description)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if len(in.AllowedDecisions) > 0 {
		b = append(b, `,"allowed_decisions":`...)
		b = appendStrings(b, in.AllowedDecisions)
	}
	b = appendOptString(b, `,"question":`, in.Question)
	b = appendOptString(b, `,"type":`, in.Type)
	if len(in.Options) > 0 {
		b = append(b, `,"options":`...)
		b = appendStrings(b, in.Options)
	}
	b = appendOptString(b, `,"tool_call_id":`, in.ToolCallID)
	return append(b, '}')
}

func appendRunUsage(b []byte, u *RunUsage) ([]byte, bool) {
	b = append(b, `{"run_id":`...)
	b = appendJSONString(b, u.RunID)
	b = append(b, `,"thread_id":`...)
	b = appendJSONString(b, u.ThreadID)
	b = append(b, `,"tenant":`...)
	b = appendJSONString(b, u.Tenant)
	b = append(b, `,"own":`...)
	b = appendUsageTotals(b, &u.Own)
	if len(u.Children) > 0 {
		b = append(b, `,"children":{`...)
		var buf [8]string
		for i, k := range sortedKeys(u.Children, buf[:0]) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			c := u.Children[k]
			b = appendUsageTotals(b, &c)
		}
		b = append(b, '}')
	}
	b = append(b, `,"total":`...)
	b = appendUsageTotals(b, &u.Total)
	b = append(b, `,"final":`...)
	b = strconv.AppendBool(b, u.Final)
	if !u.UpdatedAt.IsZero() {
		var ok bool
		b = append(b, `,"updated_at":`...)
		if b, ok = appendTime(b, u.UpdatedAt); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

func appendUsageTotals(b []byte, u *UsageTotals) []byte {
	b = append(b, '{')
	b = appendTokenFields(b, &u.TokenCounts)
	b = append(b, `,"main":{`...)
	b = appendTokenFields(b, &u.Main)
	b = append(b, `},"summary":{`...)
	b = appendTokenFields(b, &u.Summary)
	b = append(b, '}')
	if len(u.Models) > 0 {
		b = append(b, `,"models":{`...)
		var buf [8]string
		for i, k := range sortedKeys(u.Models, buf[:0]) {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, k)
			b = append(b, ':')
			m := u.Models[k]
			if m == nil {
				b = append(b, "null"...)
				continue
			}
			b = append(b, '{')
			sep := false
			if !tokenCountsZero(&m.Main) {
				b = append(b, `"main":{`...)
				b = appendTokenFields(b, &m.Main)
				b = append(b, '}')
				sep = true
			}
			if !tokenCountsZero(&m.Summary) {
				if sep {
					b = append(b, ',')
				}
				b = append(b, `"summary":{`...)
				b = appendTokenFields(b, &m.Summary)
				b = append(b, '}')
			}
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// sortedKeys returns the keys of m sorted, as encoding/json orders them,
// in buf when they fit.
func sortedKeys[V any](m map[string]V, buf []string) []string {
	for k := range m {
		buf = append(buf, k)
	}
	slices.Sort(buf)
	return buf
}

// tokenCountsZero is what omitzero tests: every field zero.
func tokenCountsZero(t *TokenCounts) bool {
	return *t == TokenCounts{}
}

// appendTokenFields appends the fields of t without the braces (it is
// also embedded in UsageTotals).
func appendTokenFields(b []byte, t *TokenCounts) []byte {
	b = append(b, `"input_tokens":`...)
	b = strconv.AppendInt(b, int64(t.Input), 10)
	b = append(b, `,"output_tokens":`...)
	b = strconv.AppendInt(b, int64(t.Output), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(t.Total), 10)
	if t.Cached != nil {
		b = append(b, `,"cached_tokens":`...)
		b = strconv.AppendInt(b, int64(*t.Cached), 10)
	}
	if t.CachedCalls != 0 {
		b = append(b, `,"cached_reported_calls":`...)
		b = strconv.AppendInt(b, int64(t.CachedCalls), 10)
	}
	b = append(b, `,"calls":`...)
	b = strconv.AppendInt(b, int64(t.Calls), 10)
	if t.ApproximateCalls != 0 {
		b = append(b, `,"approximate_calls":`...)
		b = strconv.AppendInt(b, int64(t.ApproximateCalls), 10)
	}
	return b
}

func appendOptString(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	b = append(b, key...)
	return appendJSONString(b, s)
}

func appendOptUint(b []byte, key string, n uint64) []byte {
	if n == 0 {
		return b
	}
	b = append(b, key...)
	return strconv.AppendUint(b, n, 10)
}

func appendStrings(b []byte, ss []string) []byte {
	if ss == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, s)
	}
	return append(b, ']')
}

// appendTime appends t as time.Time.MarshalJSON does; false where
// MarshalJSON fails (a year outside [0,9999], a zone offset of 24 hours
// or more).
func appendTime(b []byte, t time.Time) ([]byte, bool) {
	b = append(b, '"')
	n0 := len(b)
	b = t.AppendFormat(b, time.RFC3339Nano)
	if len(b)-n0 < len("9999-") || b[n0+len("9999")] != '-' {
		return b, false
	}
	if b[len(b)-1] != 'Z' {
		c := b[len(b)-len("Z07:00")]
		z := b[len(b)-len("07:00"):]
		if ('0' <= c && c <= '9') || 10*(z[0]-'0')+(z[1]-'0') >= 24 {
			return b, false
		}
	}
	return append(b, '"'), true
}

// appendObject appends a free-form map (metadata) with its keys sorted,
// as encoding/json does; false when it holds a type appendValue does not
// know.
func appendObject(b []byte, m map[string]any) ([]byte, bool) {
	if m == nil {
		return append(b, "null"...), true
	}
	b = append(b, '{')
	var ok bool
	var buf [8]string
	for i, k := range sortedKeys(m, buf[:0]) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, k)
		b = append(b, ':')
		if b, ok = appendValue(b, m[k]); !ok {
			return b, false
		}
	}
	return append(b, '}'), true
}

// appendValue appends a value of a free-form field: what decoding JSON
// into an any produces (with or without UseNumber), and the few Go types
// code puts there. false for anything else.
func appendValue(b []byte, v any) ([]byte, bool) {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), true
	case string:
		return appendJSONString(b, v), true
	case bool:
		return strconv.AppendBool(b, v), true
	case json.Number:
		s := string(v)
		if s == "" {
			s = "0"
		}
		if !validNumber(s) {
			return b, false
		}
		return append(b, s...), true
	case float64:
		return appendFloat(b, v)
	case int:
		return strconv.AppendInt(b, int64(v), 10), true
	case int64:
		return strconv.AppendInt(b, v, 10), true
	case map[string]any:
		return appendObject(b, v)
	case []any:
		if v == nil {
			return append(b, "null"...), true
		}
		b = append(b, '[')
		var ok bool
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = appendValue(b, e); !ok {
				return b, false
			}
		}
		return append(b, ']'), true
	case []string:
		return appendStrings(b, v), true
	case *ContextSnapshot:
		// message.completed's meta.usage.context (CompletedMessage).
		if v == nil {
			return append(b, "null"...), true
		}
		return appendContextSnapshot(b, v)
	}
	return b, false
}

func appendContextSnapshot(b []byte, c *ContextSnapshot) ([]byte, bool) {
	b = append(b, `{"encoding":`...)
	b = appendJSONString(b, c.Encoding)
	for _, f := range [...]struct {
		key string
		n   int
	}{
		{`,"context_tokens":`, c.Tokens}, {`,"system_tokens":`, c.SystemTokens}, {`,"messages_tokens":`, c.MessagesTokens},
		{`,"tools_tokens":`, c.ToolsTokens}, {`,"message_count":`, c.MessageCount}, {`,"tool_count":`, c.ToolCount},
		{`,"next_context_tokens":`, c.NextTokens}, {`,"context_window":`, c.Window},
	} {
		b = append(b, f.key...)
		b = strconv.AppendInt(b, int64(f.n), 10)
	}
	var ok bool
	b = append(b, `,"usage_ratio":`...)
	if b, ok = appendFloat(b, c.UsageRatio); !ok {
		return b, false
	}
	b = append(b, `,"remaining_tokens":`...)
	b = strconv.AppendInt(b, int64(c.Remaining), 10)
	b = append(b, `,"summarization_trigger_fraction":`...)
	if b, ok = appendFloat(b, c.TriggerFraction); !ok {
		return b, false
	}
	b = append(b, `,"summarization_trigger_tokens":`...)
	b = strconv.AppendInt(b, int64(c.TriggerTokens), 10)
	b = append(b, `,"summarization_pressure":`...)
	if b, ok = appendFloat(b, c.Pressure); !ok {
		return b, false
	}
	return append(b, '}'), true
}

// appendFloat is encoding/json's float64 encoding (ES6 number to string);
// false for NaN and infinities, which it refuses.
func appendFloat(b []byte, f float64) ([]byte, bool) {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return b, false
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-09 is written e-9
		n := len(b)
		if n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, true
}

// validNumber is the JSON number grammar encoding/json checks a
// json.Number against.
func validNumber(s string) bool {
	if s != "" && s[0] == '-' {
		s = s[1:]
	}
	if s == "" {
		return false
	}
	switch {
	case s[0] == '0':
		s = s[1:]
	case '1' <= s[0] && s[0] <= '9':
		s = skipDigits(s[1:])
	default:
		return false
	}
	if len(s) >= 2 && s[0] == '.' && isDigit(s[1]) {
		s = skipDigits(s[2:])
	}
	if len(s) >= 2 && (s[0] == 'e' || s[0] == 'E') {
		s = s[1:]
		if s[0] == '+' || s[0] == '-' {
			s = s[1:]
			if s == "" {
				return false
			}
		}
		s = skipDigits(s)
	}
	return s == ""
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func skipDigits(s string) string {
	for len(s) > 0 && isDigit(s[0]) {
		s = s[1:]
	}
	return s
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string escaped as encoding/json
// escapes it by default: quote, backslash and control characters, the
// HTML characters <, > and &, U+2028 and U+2029, and invalid UTF-8 as
// U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
