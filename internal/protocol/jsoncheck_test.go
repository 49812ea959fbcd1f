package protocol

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckJSON(t *testing.T) {
	deep := func(open, close string, n int) string { return strings.Repeat(open, n) + strings.Repeat(close, n) }
	cases := []struct {
		name, data, field, msg string
	}{
		{"plain", `{"a":[1,"x",{"b":null}],"c":true}`, "", ""},
		{"64 levels", deep("[", "]", 64), "", ""},
		{"65 levels", deep("[", "]", 65), strings.Repeat("[0]", 34)[:102] + "...", "deeper than 64 levels"},
		{"10000 levels in a field", `{"input":` + deep("[", "]", 10000) + `}`, "input" + strings.Repeat("[0]", 32) + "...", "deeper than 64"},
		{"deep objects", `{"metadata":` + deep(`{"k":`, "}", 100) + `}`, "metadata" + strings.Repeat(".k", 47) + "...", "deeper than 64"},
		{"bad utf8 value", "{\"input\":{\"messages\":[{\"role\":\"user\"},{\"content\":\"a\xffb\"}]}}", "input.messages[1].content", "is not valid UTF-8"},
		{"bad utf8 key", "{\"metadata\":{\"a\xff\":1}}", "metadata", "key that is not valid UTF-8"},
		{"bad utf8 top key", "{\"a\xff\":1}", "", "key that is not valid UTF-8"},
		{"odd key quoted", "{\"meta data\":[\"\xc3\"]}", `["meta data"][0]`, "UTF-8"},
		{"escaped quote in key", `{"a\"b":{"c":["` + "\xff" + `"]}}`, `["a\"b"].c[0]`, "UTF-8"},
		{"bad utf8 outside strings is the decoder's", "{\"a\":1\xff}", "", ""},
		{"unterminated string", `{"a":"x`, "", ""},
		{"stray closers", `]]]}}}[`, "", ""},
	}
	for _, c := range cases {
		err := CheckJSON([]byte(c.data), 0)
		if c.msg == "" {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		var ve *ValidationError
		if !errors.As(err, &ve) || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: error %v, want a ValidationError", c.name, err)
			continue
		}
		if ve.Field != c.field || !strings.Contains(ve.Message, c.msg) {
			t.Errorf("%s: field %q message %q, want field %q and %q", c.name, ve.Field, ve.Message, c.field, c.msg)
		}
	}
}

// A run request nested 10,000 levels deep (encoding/json's own limit) is
// refused before decoding, naming the field.
func TestDecodeRunRequestDeepNesting(t *testing.T) {
	for _, field := range []string{"metadata", "command"} {
		body := `{"run_id":"r1","thread_id":"t1","` + field + `":{"resume":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}}`
		_, err := DecodeRunRequest([]byte(body), 0)
		var ve *ValidationError
		if !errors.As(err, &ve) || !strings.HasPrefix(ve.Field, field+".resume[0]") || !strings.Contains(ve.Message, "deeper than 64") {
			t.Errorf("%s: %v", field, err)
		}
	}
}
