package protocol

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxJSONDepth bounds how deeply arrays and objects may nest in a run
// request or a gateway body. encoding/json stops at 10,000 levels; a
// request has no use for more than a handful, and refusing early names the
// field instead of decoding thousands of levels of garbage.
const MaxJSONDepth = 64

// CheckJSON scans encoded JSON without decoding it and reports the first
// string (key or value) that is not valid UTF-8, or the first array or
// object nested deeper than maxDepth (<= 0: MaxJSONDepth), as a
// *ValidationError whose Field is the JSON path of the offending value
// ("input.messages[0].content"). encoding/json would silently replace
// invalid UTF-8 with U+FFFD and accept 10,000 levels; callers run this
// first to refuse both with an error a person can act on. Syntax errors
// are left to the decoder: CheckJSON returns nil when it meets one.
//
// The scan is iterative and its memory is bounded by maxDepth, whatever
// the input.
func CheckJSON(data []byte, maxDepth int) error {
	if maxDepth <= 0 {
		maxDepth = MaxJSONDepth
	}
	var stack []jsonFrame
	for i := 0; i < len(data); {
		c := data[i]
		switch c {
		case ' ', '\t', '\n', '\r', ':':
			i++
		case '{', '[':
			if len(stack) == maxDepth {
				return &ValidationError{Field: jsonPath(data, stack), Message: fmt.Sprintf("nests arrays and objects deeper than %d levels", maxDepth)}
			}
			stack = append(stack, jsonFrame{object: c == '{', wantKey: c == '{', key: [2]int{-1, -1}})
			i++
		case '}', ']':
			if len(stack) == 0 {
				return nil
			}
			stack = stack[:len(stack)-1]
			i++
		case ',':
			if n := len(stack); n > 0 {
				top := &stack[n-1]
				if top.object {
					top.wantKey = true
				} else {
					top.index++
				}
			}
			i++
		case '"':
			end, ok := stringEnd(data, i)
			if !ok {
				return nil
			}
			n := len(stack)
			isKey := n > 0 && stack[n-1].object && stack[n-1].wantKey
			if isKey {
				stack[n-1].key = [2]int{i, end}
				stack[n-1].wantKey = false
			}
			if !utf8.Valid(data[i:end]) {
				field := jsonPath(data, stack)
				if isKey {
					// The key itself is broken: name where it sits.
					field = jsonPath(data, stack[:n-1])
				}
				what := "is not valid UTF-8"
				if isKey {
					what = "has a key that is not valid UTF-8"
				}
				return &ValidationError{Field: field, Message: what}
			}
			i = end
		default:
			// Numbers and literals (and anything else, a syntax error the
			// decoder will name): skip to the next delimiter.
			j := i + 1
			for j < len(data) && !isDelim(data[j]) {
				j++
			}
			i = j
		}
	}
	return nil
}

// jsonFrame is one open array or object.
type jsonFrame struct {
	object  bool
	wantKey bool   // object: the next string is a key
	key     [2]int // object: the current key's quoted bytes
	index   int    // array: the current element
}

func isDelim(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', ',', ':', '{', '}', '[', ']', '"':
		return true
	}
	return false
}

// stringEnd returns the index just past the string starting at data[i]
// (a quote); ok is false when the string never ends.
func stringEnd(data []byte, i int) (int, bool) {
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			j++
		case '"':
			return j + 1, true
		}
	}
	return 0, false
}

// maxPathLen bounds the field names CheckJSON reports: a path 64 levels
// deep says no more than its first hundred characters.
const maxPathLen = 100

// jsonPath names the value the innermost frame is at: keys joined with
// '.', array indexes in brackets, keys that are not plain ids quoted.
func jsonPath(data []byte, stack []jsonFrame) string {
	var b strings.Builder
	for _, f := range stack {
		if b.Len() > maxPathLen {
			b.WriteString("...")
			break
		}
		if !f.object {
			b.WriteString("[" + strconv.Itoa(f.index) + "]")
			continue
		}
		if f.key[0] < 0 {
			break
		}
		var key string
		raw := data[f.key[0]:f.key[1]]
		if json.Unmarshal(raw, &key) != nil || !utf8.Valid(raw) {
			key = string(raw[1 : len(raw)-1])
		}
		if ValidToken(key) {
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(key)
		} else {
			b.WriteString("[" + strconv.Quote(clip(key, 40)) + "]")
		}
	}
	return b.String()
}
