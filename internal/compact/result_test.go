package compact_test

import (
	"testing"

	"github.com/natsagent/natsagent/internal/compact"
)

func TestResultIsTheFinalEventOnly(t *testing.T) {
	for event, want := range map[string]string{
		`{"type":"context_compression","data":{"phase":"started","job_id":"c1"}}`:                     "",
		`{"type":"context_compression","data":{"phase":"completed","job_id":"c1","tokens_before":9}}`: "completed",
		`{"type":"context_compression","data":{"phase":"failed","code":"busy"}}`:                      "failed",
		`{"type":"message.delta","data":{"phase":"completed"}}`:                                       "",
		`not json`: "",
	} {
		d, ok := compact.Result([]byte(event))
		switch {
		case want == "" && ok:
			t.Errorf("%s: taken as the result", event)
		case want != "" && (!ok || d.Phase != want):
			t.Errorf("%s: result %+v %v, want phase %s", event, d, ok, want)
		}
	}
}
