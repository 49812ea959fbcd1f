package app

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// The console format colours its levels only when asked (a terminal);
// JSON lines never.
func TestLoggerColourOnlyWhenAsked(t *testing.T) {
	for _, c := range []struct {
		console, colour, want bool
	}{{true, true, true}, {true, false, false}, {false, false, false}} {
		var buf bytes.Buffer
		log := newLogger(&buf, c.console, c.colour, false)
		log.Info("run finished")
		_ = log.Sync()
		if got := strings.Contains(buf.String(), "\x1b["); got != c.want {
			t.Errorf("console %v colour %v: colour codes %v in %q", c.console, c.colour, got, buf.String())
		}
		if !c.console && !json.Valid(bytes.TrimSpace(buf.Bytes())) {
			t.Errorf("not a JSON line: %q", buf.String())
		}
	}
}
