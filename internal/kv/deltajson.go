package kv

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strconv"

	"github.com/natsagent/natsagent/internal/protocol"
)

// encodeDelta writes d as encoding/json does, byte for byte, by hand for
// what a run's checkpoint holds (messages, removals, values, no files),
// like protocol's record encoder: json.Marshal of a delta cost about 30
// allocations per no-op run. Anything else goes to encoding/json.
func encodeDelta(d *Delta) ([]byte, error) {
	if b, ok := appendDelta(make([]byte, 0, 1024), d); ok {
		return b, nil
	}
	return json.Marshal(d)
}

func appendDelta(b []byte, d *Delta) ([]byte, bool) {
	if len(d.Files) > 0 {
		return b, false
	}
	var ok bool
	b = append(b, `{"id":`...)
	b = protocol.AppendJSONString(b, d.ID)
	if d.Parent != "" {
		b = append(b, `,"parent":`...)
		b = protocol.AppendJSONString(b, d.Parent)
	}
	b = append(b, `,"run_id":`...)
	b = protocol.AppendJSONString(b, d.RunID)
	b = append(b, `,"step":`...)
	b = strconv.AppendInt(b, int64(d.Step), 10)
	b = append(b, `,"time":`...)
	if b, ok = protocol.AppendTimeJSON(b, d.Time); !ok {
		return b, false
	}
	b = append(b, `,"update":{`...)
	u := &d.Update
	first := true
	if len(u.Messages) > 0 {
		b = append(b, `"messages":[`...)
		for i := range u.Messages {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = protocol.AppendMessageJSON(b, &u.Messages[i]); !ok {
				return b, false
			}
		}
		b = append(b, ']')
		first = false
	}
	if len(u.Remove) > 0 {
		if !first {
			b = append(b, ',')
		}
		b = append(b, `"remove":`...)
		b = protocol.AppendStringsJSON(b, u.Remove)
		first = false
	}
	if len(u.Values) > 0 {
		if !first {
			b = append(b, ',')
		}
		b = append(b, `"values":{`...)
		for i, k := range slices.Sorted(maps.Keys(u.Values)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = protocol.AppendJSONString(b, k)
			b = append(b, ':')
			if b, ok = appendRaw(b, u.Values[k]); !ok {
				return b, false
			}
		}
		b = append(b, '}')
	}
	b = append(b, '}')
	for _, f := range [...]struct{ key, v string }{
		{`,"source":`, d.Source}, {`,"as_node":`, d.AsNode}, {`,"replaced":`, d.Replaced},
	} {
		if f.v != "" {
			b = append(b, f.key...)
			b = protocol.AppendJSONString(b, f.v)
		}
	}
	if d.At != "" {
		b = append(b, `,"at":`...)
		b = protocol.AppendJSONString(b, d.At)
	}
	return append(b, '}'), true
}

// appendRaw appends a json.RawMessage as encoding/json writes it: a nil
// one as null, a valid one compacted with HTML characters and U+2028/9
// escaped. Only raw JSON that needs neither (no whitespace byte, none of
// those characters) is copied here; the rest reports false.
func appendRaw(b []byte, raw json.RawMessage) ([]byte, bool) {
	if raw == nil {
		return append(b, "null"...), true
	}
	if bytes.ContainsAny(raw, " \t\r\n<>&") || bytes.Contains(raw, []byte("\u2028")) || bytes.Contains(raw, []byte("\u2029")) || !json.Valid(raw) {
		return b, false
	}
	return append(b, raw...), true
}
