package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// threadView is a thread as the API shows it: the LangGraph thread fields,
// without the lease bookkeeping the record also holds.
type threadView struct {
	ThreadID  string         `json:"thread_id"`
	CreatedAt time.Time      `json:"created_at"`
	UpdatedAt time.Time      `json:"updated_at"`
	Metadata  map[string]any `json:"metadata"`
	Status    string         `json:"status"`
	Title     string         `json:"title,omitempty"`
	// CheckpointID is the thread's latest checkpoint.
	CheckpointID string `json:"checkpoint_id,omitempty"`
	// ActiveRunID is the run holding the thread, if any.
	ActiveRunID string `json:"active_run_id,omitempty"`
	LastRunID   string `json:"last_run_id,omitempty"`
	// Owner is the user who created the thread, if authenticated.
	Owner string `json:"owner,omitempty"`
}

func viewThread(t *protocol.Thread) threadView {
	v := threadView{
		ThreadID: t.ThreadID, CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt, Metadata: t.Metadata,
		Status: t.Status, Title: t.Title, CheckpointID: t.Head, LastRunID: t.LastRunID, Owner: t.Owner,
	}
	if v.Metadata == nil {
		v.Metadata = map[string]any{}
	}
	if v.Status == "" {
		v.Status = protocol.ThreadIdle
	}
	if t.Lease != nil {
		v.ActiveRunID = t.Lease.RunID
	}
	return v
}

// newThread is the record of a thread created by the gateway.
func newThread(tenant, thread string, metadata map[string]any) *protocol.Thread {
	now := time.Now().UTC()
	return &protocol.Thread{ThreadID: thread, Tenant: tenant, CreatedAt: now, UpdatedAt: now, Status: protocol.ThreadIdle, Metadata: metadata}
}

type createThreadBody struct {
	ThreadID string         `json:"thread_id"`
	Metadata map[string]any `json:"metadata"`
	IfExists string         `json:"if_exists"`
}

// createThread: POST /threads.
func (s *Server) createThread(w http.ResponseWriter, r *http.Request, tenant string) error {
	var body createThreadBody
	if err := decodeBody(r, &body); err != nil {
		return err
	}
	switch body.IfExists {
	case "", "raise", "do_nothing":
	default:
		return errInvalid("if_exists", fmt.Sprintf("%q is not one of raise, do_nothing", body.IfExists))
	}
	if body.ThreadID == "" {
		body.ThreadID = newID()
	}
	if err := protocol.CheckToken("thread_id", body.ThreadID); err != nil {
		return err
	}
	if err := checkMetadataFields(len(body.Metadata)); err != nil {
		return err
	}
	th := newThread(tenant, body.ThreadID, body.Metadata)
	th.Owner = ownerOf(r)
	_, err := s.stores.Threads.Put(r.Context(), th, 0)
	if errors.Is(err, kv.ErrExists) {
		th, _, err = s.stores.Threads.GetLatest(r.Context(), tenant, body.ThreadID)
		if err == nil && !s.mayUse(r, th) {
			// Another user's thread is as absent as another tenant's:
			// a create names it taken without showing it.
			body.IfExists = "raise"
		}
		if err == nil && body.IfExists != "do_nothing" {
			return errConflict(fmt.Sprintf("thread %s already exists; send \"if_exists\": \"do_nothing\" to get it instead", body.ThreadID))
		}
	}
	if err != nil {
		return err
	}
	s.log.Debug("thread created", zap.String("tenant", tenant), zap.String("thread_id", th.ThreadID))
	writeJSON(w, http.StatusOK, viewThread(th))
	return nil
}

// checkMetadataFields refuses a thread's metadata, or a metadata filter,
// of more than protocol.MaxThreadMetadataFields fields.
func checkMetadataFields(n int) error {
	if n > protocol.MaxThreadMetadataFields {
		return errInvalid("metadata", fmt.Sprintf("metadata has %d fields, more than the %d a thread may have", n, protocol.MaxThreadMetadataFields))
	}
	return nil
}

// getThread: GET /threads/{thread_id}, with the thread's values as a
// search shows them.
func (s *Server) getThread(w http.ResponseWriter, r *http.Request, tenant string) error {
	th, err := s.thread(r, tenant)
	if err != nil {
		return err
	}
	trimThread(th)
	view := []searchedThread{{threadView: viewThread(th)}}
	if err := s.loadValues(r.Context(), []protocol.Thread{*th}, view); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, view[0])
	return nil
}

// thread reads the thread named in the path.
func (s *Server) thread(r *http.Request, tenant string) (*protocol.Thread, error) {
	thread, err := pathToken(r, "thread_id")
	if err != nil {
		return nil, err
	}
	th, _, err := s.stores.Threads.Get(r.Context(), tenant, thread)
	if errors.Is(err, kv.ErrNotFound) {
		return nil, errNotFound(fmt.Sprintf("thread %s not found", thread))
	}
	return th, err
}

// listThreads: GET /threads, newest created first, with ?status=,
// ?limit= and ?offset=, from the creation index (threadscan.go).
func (s *Server) listThreads(w http.ResponseWriter, r *http.Request, tenant string) error {
	page, err := pageOf(r)
	if err != nil {
		return err
	}
	status := r.URL.Query().Get("status")
	owner, _ := s.ownerFilter(r)
	top, _, err := s.createdThreads(r.Context(), tenant, true, page.offset+page.limit, owner, func(th *protocol.Thread) bool {
		return (status == "" || th.Status == status) && s.mayUse(r, th)
	})
	if err != nil {
		return errUnavailable("the threads bucket is not available", err)
	}
	out := make([]threadView, 0, len(top))
	for i := range top {
		out = append(out, viewThread(&top[i]))
	}
	writeJSON(w, http.StatusOK, paginate(page, out))
	return nil
}

// stateView is a thread's state at its head checkpoint, in LangGraph's
// shape: messages and the other state values side by side under values.
type stateView struct {
	Values             map[string]json.RawMessage `json:"values"`
	CheckpointID       *string                    `json:"checkpoint_id"`
	ParentCheckpointID *string                    `json:"parent_checkpoint_id"`
	CreatedAt          *time.Time                 `json:"created_at"`
	ThreadID           string                     `json:"thread_id"`
	Status             string                     `json:"status"`
}

// nativeState: GET /threads/{thread_id}/state?format=natsagent, the state
// with natsagent's messages.
func (s *Server) nativeState(w http.ResponseWriter, r *http.Request, th *protocol.Thread) error {
	tenant := th.Tenant
	st, chain, err := s.stores.Checkpoints.Load(r.Context(), tenant, th.ThreadID, th.Head)
	if err != nil {
		return err
	}
	values := make(map[string]json.RawMessage, len(st.Values)+1)
	for k, v := range st.Values {
		values[k] = v
	}
	msgs := st.Messages
	if msgs == nil {
		msgs = []model.Message{}
	}
	if values["messages"], err = json.Marshal(msgs); err != nil {
		return err
	}
	view := stateView{Values: values, ThreadID: th.ThreadID, Status: viewThread(th).Status}
	if n := len(chain); n > 0 {
		head := chain[n-1]
		view.CheckpointID = &head.ID
		view.CreatedAt = &head.Time
		if head.Parent != "" {
			view.ParentCheckpointID = &head.Parent
		}
	}
	writeJSON(w, http.StatusOK, view)
	return nil
}

// historyEntry is one checkpoint of a thread: what its step changed.
type historyEntry struct {
	CheckpointID       string       `json:"checkpoint_id"`
	ParentCheckpointID string       `json:"parent_checkpoint_id,omitempty"`
	RunID              string       `json:"run_id"`
	Step               int          `json:"step"`
	CreatedAt          time.Time    `json:"created_at"`
	Changes            state.Update `json:"changes"`
}

// nativeHistory lists the checkpoints of a thread's current history,
// newest first, as natsagent stores them (?format=natsagent). Each entry
// holds what its step changed; replaying them oldest first rebuilds the
// state.
func (s *Server) nativeHistory(w http.ResponseWriter, r *http.Request, th *protocol.Thread) error {
	tenant := th.Tenant
	p, err := pageOf(r)
	if err != nil {
		return err
	}
	_, chain, err := s.stores.Checkpoints.Load(r.Context(), tenant, th.ThreadID, th.Head)
	if err != nil {
		return err
	}
	out := []historyEntry{}
	for i := len(chain) - 1 - p.offset; i >= 0 && len(out) < p.limit; i-- {
		d := chain[i]
		out = append(out, historyEntry{CheckpointID: d.ID, ParentCheckpointID: d.Parent, RunID: d.RunID, Step: d.Step, CreatedAt: d.Time, Changes: d.Update})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// page is a listing's ?limit= and ?offset=.
type page struct{ limit, offset int }

const (
	defaultLimit = 50
	maxLimit     = 1000
	maxOffset    = 1_000_000
)

func pageOf(r *http.Request) (page, error) {
	p := page{limit: defaultLimit}
	q := r.URL.Query()
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			return p, errInvalid("limit", fmt.Sprintf("limit must be a number from 1 to %d", maxLimit))
		}
		p.limit = n
	}
	if v := q.Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxOffset {
			return p, errInvalid("offset", fmt.Sprintf("offset must be a number from 0 to %d", maxOffset))
		}
		p.offset = n
	}
	return p, nil
}

// paginate returns the page p of items.
func paginate[T any](p page, items []T) []T {
	from := min(p.offset, len(items))
	to := min(from+p.limit, len(items))
	return items[from:to]
}
