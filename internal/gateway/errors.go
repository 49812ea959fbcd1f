package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/protocol"
)

// apiError is an error with the HTTP status and body it is answered with.
type apiError struct {
	status int
	code   string
	msg    string
	field  string
	cause  error
	// store names the stream or bucket a store_full error hit.
	store string
}

func (e *apiError) Error() string {
	if e.cause != nil {
		return e.msg + ": " + e.cause.Error()
	}
	return e.msg
}

func (e *apiError) Unwrap() error { return e.cause }

func errInvalid(field, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, code: protocol.CodeInvalid, msg: msg, field: field}
}

func errNotFound(msg string) *apiError {
	return &apiError{status: http.StatusNotFound, code: protocol.CodeNotFound, msg: msg}
}

func errConflict(msg string) *apiError {
	return &apiError{status: http.StatusConflict, code: protocol.CodeConflict, msg: msg}
}

// errDeleting refuses a run on a thread being deleted.
func errDeleting(thread string) *apiError {
	return &apiError{status: http.StatusConflict, code: protocol.CodeBusy,
		msg: fmt.Sprintf("thread %s is being deleted; a run submitted once the deletion ends starts a new thread", thread)}
}

func errUnavailable(msg string, cause error) *apiError {
	return &apiError{status: http.StatusServiceUnavailable, code: protocol.CodeUnavailable, msg: msg, cause: cause}
}

func errTooLarge(msg string) *apiError {
	return &apiError{status: http.StatusRequestEntityTooLarge, code: protocol.CodeInvalid, msg: msg}
}

// storeFullRetryAfter is the Retry-After of a store_full answer: space
// comes back when an operator frees it, not on its own.
const storeFullRetryAfter = 30

// errStoreFull answers a write JetStream refused for lack of room (507,
// code store_full, with Retry-After), naming the stream or bucket and
// quoting the server.
func errStoreFull(store string, cause error) *apiError {
	if store == "" {
		store = "unknown"
	}
	said := bus.StoreFullText(cause)
	return &apiError{status: http.StatusInsufficientStorage, code: protocol.CodeStoreFull, store: store,
		msg: fmt.Sprintf("JetStream has no room to store this (%s: %s); nothing was stored. An operator must free space; try again later", store, said)}
}

// classify turns any error into the status and body it is answered with.
func classify(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var ve *protocol.ValidationError
	if errors.As(err, &ve) {
		return errInvalid(ve.Field, ve.Error())
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errTooLarge(fmt.Sprintf("request body is over the limit of %d bytes", mbe.Limit))
	}
	if store, full := bus.IsStoreFull(err); full {
		return errStoreFull(store, err)
	}
	if unavailable(err) {
		return errUnavailable("NATS is unavailable; try again", err)
	}
	return &apiError{status: http.StatusInternalServerError, code: protocol.CodeInternal, msg: "internal error", cause: err}
}

// unavailable reports errors that mean NATS or JetStream cannot answer
// now, as opposed to a bug.
func unavailable(err error) bool {
	for _, target := range []error{
		nats.ErrNoResponders, nats.ErrTimeout, nats.ErrConnectionClosed, nats.ErrConnectionDraining,
		nats.ErrConnectionReconnecting, nats.ErrDisconnected, jetstream.ErrNoStreamResponse,
		jetstream.ErrJetStreamNotEnabled, context.DeadlineExceeded,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		data, _ = json.Marshal(protocol.ErrorReply{Error: protocol.ErrorBody{Code: protocol.CodeInternal, Message: "encode response: " + err.Error()}})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.code == protocol.CodeStoreFull {
		w.Header().Set("Retry-After", strconv.Itoa(storeFullRetryAfter))
	}
	msg := e.msg
	if e.cause != nil && e.status != http.StatusInternalServerError {
		msg = e.Error()
	}
	writeJSON(w, e.status, protocol.ErrorReply{Error: protocol.ErrorBody{Code: e.code, Message: msg, Field: e.field}})
}

// decodeBody decodes a JSON request body into v. An empty body leaves v
// unchanged. Unknown fields are ignored, so clients written for the
// LangGraph API can send the options natsagent does not use.
func decodeBody(r *http.Request, v any) error {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return err
		}
		return errInvalid("", "could not read the request body: "+err.Error())
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	// encoding/json would turn invalid UTF-8 into U+FFFD and accept 10,000
	// levels of nesting: refuse both, naming the field.
	if err := protocol.CheckJSON(data, protocol.MaxJSONDepth); err != nil {
		return err
	}
	if !utf8.Valid(data) {
		return errInvalid("", "request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return errInvalid(te.Field, fmt.Sprintf("request body: %s must be %s, not %s", fieldName(te.Field), jsonKind(te.Type), te.Value))
		}
		return errInvalid("", "request body is not valid JSON: "+err.Error())
	}
	if _, err := dec.Token(); err != io.EOF {
		return errInvalid("", "request body has data after the JSON value")
	}
	return nil
}

// jsonKind names what JSON a Go type decodes from.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return t.String()
}

func fieldName(f string) string {
	if f == "" {
		return "the body"
	}
	return f
}
