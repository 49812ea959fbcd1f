package bus

import (
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// JetStream API error codes (nats-server's errors.json) by which a server
// refuses a write because there is no room for it: nothing was stored,
// and the same write succeeds once space is freed.
const (
	// errCodeInsufficientResources: the server's JetStream store is full
	// (max_file_store or max_memory_store reached), 503.
	errCodeInsufficientResources = 10023
	// errCodeAccountResources: the account's JetStream limits are reached.
	errCodeAccountResources = 10002
	// errCodeStorageResources and errCodeMemoryResources: the server or
	// account cannot take more file or memory storage.
	errCodeStorageResources = 10047
	errCodeMemoryResources  = 10028
	// errCodeStoreFailed is the generic "storing the message failed"
	// (JSStreamStoreFailedF, 503) whose description is the store's own
	// error: a stream or bucket with discard new at its max_bytes or
	// max_msgs answers with one of storeLimitTexts.
	errCodeStoreFailed = 10077
	// ErrCodeSubmitStoreFull is the err_code (with code 507) of natsagent's
	// submit service when JetStream had no room for a submission
	// (intake.ErrCodeStoreFull); a client of the service reads it as a
	// full store too.
	ErrCodeSubmitStoreFull = 10908
)

// storeLimitTexts are the store errors (nats-server store.go ErrMaxBytes,
// ErrMaxMsgs) that a stream with discard new answers with when it is at
// its limit. The per-subject limit is not here: it is a stream's design
// (a KV bucket's history), not a full store.
var storeLimitTexts = map[string]bool{
	"maximum bytes exceeded":    true,
	"maximum messages exceeded": true,
}

// StoreFullError is a write refused because JetStream had no room for it.
// Store names the stream or bucket the write went to (a server-wide limit
// refuses writes to every stream; the name is the one this write hit).
type StoreFullError struct {
	Store string
	Err   error
}

func (e *StoreFullError) Error() string {
	return "JetStream has no room in " + e.Store + ": " + e.Err.Error()
}

func (e *StoreFullError) Unwrap() error { return e.Err }

// ErrStoreFull matches every store-full error with errors.Is.
var ErrStoreFull = errors.New("JetStream store full")

// Is makes errors.Is(err, ErrStoreFull) true for a StoreFullError.
func (e *StoreFullError) Is(target error) bool { return target == ErrStoreFull }

// IsStoreFull reports whether err is a write JetStream refused for lack of
// room, and the stream or bucket it names ("" when the error was not
// marked with one: a raw JetStream API error).
func IsStoreFull(err error) (store string, ok bool) {
	if err == nil {
		return "", false
	}
	var sf *StoreFullError
	if errors.As(err, &sf) {
		return sf.Store, true
	}
	return "", storeFullCode(err)
}

// IsStoreFullErr is IsStoreFull without the store's name.
func IsStoreFullErr(err error) bool {
	_, ok := IsStoreFull(err)
	return ok
}

// StoreFullText is what the server said when it refused a write for lack
// of room ("insufficient resources", "maximum bytes exceeded"), or err's
// text if it is not such a refusal.
func StoreFullText(err error) string {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.Description != "" {
		return apiErr.Description
	}
	return err.Error()
}

// storeFullCode reports a raw JetStream API error that means no room.
func storeFullCode(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case errCodeInsufficientResources, errCodeAccountResources, errCodeStorageResources, errCodeMemoryResources, ErrCodeSubmitStoreFull:
		return true
	case errCodeStoreFailed:
		return storeLimitTexts[apiErr.Description]
	}
	return false
}

// MarkStoreFull returns err as a StoreFullError naming store when it is a
// refusal for lack of room, and err unchanged otherwise.
func MarkStoreFull(store string, err error) error {
	if err == nil {
		return nil
	}
	var sf *StoreFullError
	if errors.As(err, &sf) || !storeFullCode(err) {
		return err
	}
	return &StoreFullError{Store: store, Err: err}
}
