package protocol

import (
	"errors"
	"strings"
	"testing"
)

// Input messages carry images as references or http(s) URLs, never as
// data URLs: inline bytes would be stored in the thread's checkpoints
// (deer-flow #4138).
func TestInputPartsChecked(t *testing.T) {
	const ref = `{"type":"image_file","image_file":{"sha256":"` + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" + `","mime_type":"image/png"}}`
	for _, c := range []struct{ parts, field, says string }{
		{`[{"type":"image_url","image_url":"data:image/png;base64,iVBORw0KGgo="}]`, "input.messages[0].parts[0].image_url", "data URL"},
		{`[{"type":"image_url","image_url":"file:///etc/passwd"}]`, "input.messages[0].parts[0].image_url", "http"},
		{`[{"type":"image_file","image_file":{"sha256":"../x","mime_type":"image/png"}}]`, "input.messages[0].parts[0].image_file.sha256", "SHA-256"},
		{`[{"type":"image_file","image_file":{"sha256":"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef","mime_type":"image/svg+xml"}}]`, "input.messages[0].parts[0].image_file.mime_type", "image/png"},
		{`[{"type":"audio"}]`, "input.messages[0].parts[0].type", "not a part type"},
	} {
		body := `{"run_id":"r1","thread_id":"t1","input":{"messages":[{"role":"user","content":"look","parts":` + c.parts + `}]}}`
		_, err := DecodeRunRequest([]byte(body), 0)
		var ve *ValidationError
		if !errors.As(err, &ve) || ve.Field != c.field || !strings.Contains(ve.Message, c.says) {
			t.Errorf("%s: error %v", c.parts, err)
		}
	}
	body := `{"run_id":"r1","thread_id":"t1","input":{"messages":[{"role":"user","content":"look","parts":[{"type":"text","text":"look"},` + ref + `,{"type":"image_url","image_url":"https://example.com/a.png"}]}]}}`
	if _, err := DecodeRunRequest([]byte(body), 0); err != nil {
		t.Fatalf("valid parts refused: %v", err)
	}
	sys := `{"run_id":"r1","thread_id":"t1","input":{"messages":[{"role":"system","content":"x","parts":[` + ref + `]}]}}`
	if _, err := DecodeRunRequest([]byte(sys), 0); err == nil {
		t.Fatal("a system message with an image was accepted")
	}
}
