package middleware

import (
	"encoding/json"
	"strings"
	"testing"
)

// A setting of the wrong kind is named with its path and the kind it
// takes, never a Go type.
func TestSettingsTypeErrorInWords(t *testing.T) {
	var c ContextCompression
	err := decodeSettings(json.RawMessage(`{"keep":{"messages":"twenty"}}`), &c)
	if err == nil || !strings.Contains(err.Error(), "keep.messages must be a whole number, not a JSON string") {
		t.Fatalf("error %v", err)
	}
	for _, goish := range []string{"Go struct", "int", "ContextCompression"} {
		if strings.Contains(err.Error(), goish) {
			t.Errorf("the error speaks Go (%q): %v", goish, err)
		}
	}
}
