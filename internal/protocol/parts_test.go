package protocol

import (
	"errors"
	"strings"
	"testing"
)

// Input messages never carry content parts: inline images would be stored
// in the thread's checkpoints (deer-flow #4138).
func TestInputPartsRefused(t *testing.T) {
	body := `{"run_id":"r1","thread_id":"t1","input":{"messages":[{"role":"user","content":"look","parts":[{"type":"image_url","image_url":"data:image/png;base64,iVBORw0KGgo="}]}]}}`
	_, err := DecodeRunRequest([]byte(body), 0)
	var ve *ValidationError
	if !errors.As(err, &ve) || ve.Field != "input.messages[0].parts" || !strings.Contains(ve.Message, "view_image") {
		t.Fatalf("error %v", err)
	}
}
