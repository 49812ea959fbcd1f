package bus

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// What a cluster answers between leaders is sent again; what a limit or
// the configuration answers is not: a full stream stays full.
func TestTransientTellsElectionsFromLimits(t *testing.T) {
	api := func(code int, errCode jetstream.ErrorCode, desc string) error {
		return fmt.Errorf("write: %w", &jetstream.APIError{Code: code, ErrorCode: errCode, Description: desc})
	}
	for err, want := range map[error]bool{
		api(503, 10008, "JetStream system temporarily unavailable"):                   true,
		api(503, 10163, "expected last sequence per subject temporarily unavailable"): true,
		api(409, 10158, "duplicate message id is in process"):                         true,
		api(503, 10077, "maximum bytes exceeded"):                                     false,
		api(503, 10023, "insufficient resources"):                                     false,
		api(400, 10071, "wrong last sequence: 4"):                                     false,
		nats.ErrNoResponders:                            true,
		jetstream.ErrNoStreamResponse:                   true,
		fmt.Errorf("get: %w", context.DeadlineExceeded): true,
		nats.ErrConnectionReconnecting:                  true,
		errors.New("run request is not valid JSON"):     false,
	} {
		if got := Transient(err); got != want {
			t.Errorf("Transient(%v) = %v, want %v", err, got, want)
		}
	}
}
