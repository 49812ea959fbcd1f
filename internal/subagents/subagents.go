// Package subagents owns subagent runs: starting a child run for a lead
// run's tool call (ids derived from the call, so a retry or a recovered
// lead finds the same child), reading a child's status and progress,
// cancelling it, and waiting for its end without holding a goroutine per
// waiter. It serves these as the NATS micro service natsagent-subagents
// (P.subagent.<tenant>.start|status|cancel|await), which every worker
// runs in one queue group, and gives the lead's tools the same operations
// in process (middleware.Delegator). A child is an ordinary run request on
// the runs stream: this package publishes it the way the gateway does and
// never executes anything; the worker runs children like any run.
package subagents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/submit"
)

// Catalog says which subagents a lead profile may start (agent.Agents).
type Catalog interface {
	MaySpawn(lead, subagent string) (ok bool, allowed []string)
}

// Config configures a Service. Zero values take defaults.
type Config struct {
	Settings bus.Settings
	Catalog  Catalog
	Logger   *zap.Logger
	// MaxAwaits bounds the awaits waiting at once in this process
	// (default 1024); beyond it an await is refused with 503.
	MaxAwaits int
	// MaxInFlight bounds the requests of one operation handled at once
	// (default 64); more wait in the subscription's buffer.
	MaxInFlight int
	// Recheck is how often a waited-for run's record is read again, in
	// case its run.finished event was missed (default 15s).
	Recheck time.Duration
}

// Service starts and follows subagent runs.
type Service struct {
	cfg    Config
	nc     *nats.Conn
	js     jetstream.JetStream
	names  bus.Names
	stores *kv.Stores
	queue  *submit.Queue
	runs   jetstream.Stream
	evs    jetstream.Stream
	log    *zap.Logger
	hub    *hub

	inflight map[string]chan struct{} // by operation
	svc      micro.Service
}

var _ middleware.Delegator = (*Service)(nil)

// New binds a service to a connection; the deployment's assets must exist.
func New(ctx context.Context, nc *nats.Conn, cfg Config) (*Service, error) {
	cfg.Settings = cfg.Settings.WithDefaults()
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.MaxAwaits <= 0 {
		cfg.MaxAwaits = 1024
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = 64
	}
	if cfg.Recheck <= 0 {
		cfg.Recheck = 15 * time.Second
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	names := cfg.Settings.Names
	stores, err := kv.Open(ctx, js, names)
	if err != nil {
		return nil, err
	}
	pub, err := events.NewPublisher(ctx, js, names, cfg.Logger)
	if err != nil {
		return nil, err
	}
	runs, err := js.Stream(ctx, names.RunsStream())
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", names.RunsStream(), err)
	}
	evs, err := js.Stream(ctx, names.EventsStream())
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", names.EventsStream(), err)
	}
	s := &Service{cfg: cfg, nc: nc, js: js, names: names, stores: stores, runs: runs, evs: evs, log: cfg.Logger,
		inflight: make(map[string]chan struct{})}
	s.queue = &submit.Queue{JS: js, Names: names, Stores: stores, Events: pub, Submitter: "subagents"}
	for _, op := range []string{protocol.SubagentStartOp, protocol.SubagentStatusOp, protocol.SubagentCancelOp, protocol.SubagentAwaitOp} {
		s.inflight[op] = make(chan struct{}, cfg.MaxInFlight)
	}
	s.hub = newHub(nc, names, cfg.MaxAwaits, cfg.Recheck, s.read, cfg.Logger)
	return s, nil
}

// Errors the service answers with.
func errInvalid(format string, args ...any) error {
	return &protocol.SubagentError{Code: protocol.CodeInvalid, Message: fmt.Sprintf(format, args...)}
}

func errNotFound(format string, args ...any) error {
	return &protocol.SubagentError{Code: protocol.CodeNotFound, Message: fmt.Sprintf(format, args...)}
}

func errConflict(format string, args ...any) error {
	return &protocol.SubagentError{Code: protocol.CodeConflict, Message: fmt.Sprintf(format, args...)}
}

// ErrTooManyAwaits refuses an await beyond Config.MaxAwaits.
var ErrTooManyAwaits = &protocol.SubagentError{Code: protocol.CodeUnavailable, Message: "too many awaits are waiting on this worker; retry shortly"}

// ErrStopping answers awaits still waiting when the service stops.
var ErrStopping = &protocol.SubagentError{Code: protocol.CodeUnavailable, Message: "the worker serving this await is stopping; await again"}

// Metadata keys of a child thread's record.
const (
	MetaSubagent     = "subagent"
	MetaParentThread = "parent_thread_id"
	MetaParentRun    = "parent_run_id"
	MetaToolCallID   = "tool_call_id"
)

// StartSubagent starts the child run of a lead run's tool call, or finds
// the one an earlier start of the same call made.
func (s *Service) StartSubagent(ctx context.Context, tenant string, req *protocol.SubagentStart) (*protocol.SubagentStarted, error) {
	if err := protocol.CheckToken("tenant", tenant); err != nil {
		return nil, errInvalid("%v", err)
	}
	if err := req.Check(); err != nil {
		return nil, errInvalid("%v", err)
	}
	thread := req.ThreadID
	if thread == "" {
		thread = protocol.SubagentThreadID(req.Parent.ThreadID, req.Parent.RunID, req.Subagent, req.Parent.ToolCallID)
	}
	run := protocol.SubagentRunID(thread, req.Parent.RunID, req.Parent.ToolCallID)
	started := func(rec *protocol.Run, existing bool) *protocol.SubagentStarted {
		return &protocol.SubagentStarted{RunID: run, ThreadID: thread, Subagent: req.Subagent, Status: rec.Status, Existing: existing}
	}

	// A retried start, or a recovered lead re-running its call.
	if rec, _, err := s.stores.RunView(ctx, tenant, thread, run); err == nil {
		if rec.Parent == nil || rec.Parent.RunID != req.Parent.RunID || rec.ThreadID != thread {
			return nil, errConflict("run id %s is taken by another run", run)
		}
		return started(rec, true), nil
	} else if !errors.Is(err, kv.ErrNotFound) {
		return nil, err
	}

	// Since protocol v2 a running run's record stays pending (or missing)
	// while its thread's lease says it runs: the view puts them together.
	parent, _, err := s.stores.RunView(ctx, tenant, req.Parent.ThreadID, req.Parent.RunID)
	switch {
	case errors.Is(err, kv.ErrNotFound):
		return nil, errNotFound("no run %s: parent.run_id must name the running run that delegates", req.Parent.RunID)
	case err != nil:
		return nil, err
	case parent.ThreadID != req.Parent.ThreadID:
		return nil, errInvalid("run %s is on thread %s, not %s", parent.RunID, parent.ThreadID, req.Parent.ThreadID)
	case parent.Parent != nil:
		return nil, errInvalid("run %s is itself a subagent run: a subagent cannot start subagents", parent.RunID)
	case parent.Status != protocol.StatusRunning:
		return nil, errConflict("run %s is %s, not running: only a running run can start subagents", parent.RunID, parent.Status)
	}
	if s.cfg.Catalog != nil {
		if ok, allowed := s.cfg.Catalog.MaySpawn(parent.Agent, req.Subagent); !ok {
			list := "none"
			if len(allowed) > 0 {
				list = strings.Join(allowed, ", ")
			}
			return nil, errInvalid("agent %s may not start subagent %q (it may start: %s)", parent.Agent, req.Subagent, list)
		}
	}

	if req.ThreadID != "" {
		if err := s.checkContinuation(ctx, tenant, req); err != nil {
			return nil, err
		}
	} else if err := s.createThread(ctx, tenant, thread, req); err != nil {
		return nil, err
	}

	child := &protocol.RunRequest{
		RunID:             run,
		ThreadID:          thread,
		Tenant:            tenant,
		Agent:             req.Subagent,
		Input:             &protocol.Input{Messages: []model.Message{{Role: model.RoleUser, Content: req.Task}}},
		MultitaskStrategy: protocol.StrategyEnqueue,
		Config:            req.Config,
		Principal:         req.Principal,
		Metadata:          map[string]any{MetaSubagent: req.Subagent},
		Parent:            &protocol.Parent{RunID: req.Parent.RunID, ThreadID: req.Parent.ThreadID, ToolCallID: req.Parent.ToolCallID},
	}
	data, err := json.Marshal(child)
	if err != nil {
		return nil, err
	}
	if limit := s.cfg.Settings.MaxRequestBytes; len(data) > limit {
		return nil, errInvalid("the child run request is %d bytes, over the limit of %d; put large content in files", len(data), limit)
	}
	// Enqueued as the gateway enqueues a run: Nats-Msg-Id dedupes a
	// retried start, run.queued goes before the record, and a record a
	// worker created first stands. The child's run span hangs under the
	// span of the call that started it (the lead's tool call, in ctx), so
	// one trace holds both runs.
	out, err := s.queue.Enqueue(ctx, child, data)
	if err != nil {
		return nil, fmt.Errorf("enqueue the child run: %w", err)
	}
	rec, existing := out.Record, out.Ack.Duplicate
	s.log.Debug("subagent started", zap.String("tenant", tenant), zap.String("parent_run_id", req.Parent.RunID),
		zap.String("run_id", run), zap.String("thread_id", thread), zap.String("subagent", req.Subagent), zap.Bool("duplicate", existing))
	return started(rec, existing), nil
}

// createThread creates a new child thread's record, naming its parent.
func (s *Service) createThread(ctx context.Context, tenant, thread string, req *protocol.SubagentStart) error {
	now := time.Now().UTC()
	th := &protocol.Thread{ThreadID: thread, Tenant: tenant, CreatedAt: now, UpdatedAt: now, Status: protocol.ThreadIdle,
		Metadata: map[string]any{MetaSubagent: req.Subagent, MetaParentThread: req.Parent.ThreadID, MetaParentRun: req.Parent.RunID, MetaToolCallID: req.Parent.ToolCallID}}
	if req.Principal != nil {
		th.Owner = req.Principal.User // the lead's user owns the child's thread
	}
	_, err := s.stores.Threads.Put(ctx, th, 0)
	if errors.Is(err, kv.ErrExists) {
		// An earlier attempt of this start (the id is derived from it).
		return nil
	}
	return err
}

// checkContinuation allows a start on an existing child thread of the same
// parent thread and subagent, unless a run is active there: a busy thread
// is answered busy, never queued behind.
func (s *Service) checkContinuation(ctx context.Context, tenant string, req *protocol.SubagentStart) error {
	th, _, err := s.stores.Threads.Get(ctx, tenant, req.ThreadID)
	if errors.Is(err, kv.ErrNotFound) {
		return errNotFound("no thread %s to continue; leave thread_id out to start a new subagent", req.ThreadID)
	}
	if err != nil {
		return err
	}
	sub, _ := th.Metadata[MetaSubagent].(string)
	parentThread, _ := th.Metadata[MetaParentThread].(string)
	if sub != req.Subagent || parentThread != req.Parent.ThreadID {
		return errInvalid("thread %s is not a %s subagent thread of thread %s; leave thread_id out to start a new subagent", req.ThreadID, req.Subagent, req.Parent.ThreadID)
	}
	active, err := s.activeRun(ctx, th)
	if err != nil {
		return err
	}
	if active != "" {
		return &protocol.SubagentError{Code: protocol.CodeBusy, ThreadID: th.ThreadID, ActiveRunID: active,
			Message: fmt.Sprintf("subagent thread %s is busy with run %s; await, check or cancel it, then start again", th.ThreadID, active)}
	}
	return nil
}

// activeRun names a run that holds, reserved or waits for a thread ("" when
// none), like the gateway's reject check.
func (s *Service) activeRun(ctx context.Context, th *protocol.Thread) (string, error) {
	active := func(run string) (bool, error) {
		r, _, err := s.stores.Runs.Get(ctx, th.Tenant, run)
		if errors.Is(err, kv.ErrNotFound) {
			r, err = nil, nil
		}
		if err != nil {
			return false, err
		}
		v := protocol.RunView(run, r, th)
		return v != nil && !v.Status.Terminal(), nil
	}
	if th.Lease != nil {
		if ok, err := active(th.Lease.RunID); err != nil || ok {
			return th.Lease.RunID, err
		}
	}
	for _, p := range th.Preempt {
		if ok, err := active(p.RunID); err != nil || ok {
			return p.RunID, err
		}
	}
	// Requests stay in the work-queue stream until their run ends.
	subject := s.names.RunSubject(th.Tenant, th.ThreadID)
	var seq uint64
	for range 100 {
		m, err := s.runs.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return "", nil
		}
		if err != nil {
			return "", err
		}
		seq = m.Sequence + 1
		run := protocol.RunIDFromMsgID(th.Tenant, m.Header.Get(jetstream.MsgIDHeader))
		if run == "" {
			continue
		}
		r, _, err := s.stores.Runs.Get(ctx, th.Tenant, run)
		if errors.Is(err, kv.ErrNotFound) || (err == nil && !r.Status.Terminal()) {
			return run, nil
		}
		if err != nil {
			return "", err
		}
	}
	return "", nil
}

// child reads a subagent run's record for a query, refusing a run that is
// not a subagent run or not a child of q.ParentRunID.
func (s *Service) child(ctx context.Context, tenant string, q protocol.SubagentQuery) (*protocol.Run, error) {
	if err := protocol.CheckToken("tenant", tenant); err != nil {
		return nil, errInvalid("%v", err)
	}
	if err := protocol.CheckToken("run_id", q.RunID); err != nil {
		return nil, errInvalid("%v", err)
	}
	if q.ParentRunID != "" {
		if err := protocol.CheckToken("parent_run_id", q.ParentRunID); err != nil {
			return nil, errInvalid("%v", err)
		}
	}
	rec, err := s.read(ctx, tenant, q.RunID)
	if errors.Is(err, kv.ErrNotFound) {
		return nil, errNotFound("no subagent run %s.", q.RunID)
	}
	if err != nil {
		return nil, err
	}
	if rec.Parent == nil {
		return nil, errNotFound("run %s is not a subagent run.", q.RunID)
	}
	if q.ParentRunID != "" && rec.Parent.RunID != q.ParentRunID {
		return nil, errNotFound("no subagent run %s of run %s.", q.RunID, q.ParentRunID)
	}
	return rec, nil
}

func (s *Service) read(ctx context.Context, tenant, run string) (*protocol.Run, error) {
	rec, _, err := s.stores.RunView(ctx, tenant, "", run)
	return rec, err
}

// view is the status of a child as the service answers it.
func (s *Service) view(ctx context.Context, rec *protocol.Run) *protocol.SubagentStatus {
	st := &protocol.SubagentStatus{RunID: rec.RunID, ThreadID: rec.ThreadID, Subagent: rec.Agent, Status: rec.Status,
		StopReason: rec.StopReason, Error: rec.Error}
	if rec.Parent != nil {
		st.ParentRunID = rec.Parent.RunID
	}
	if rec.Status.Terminal() {
		st.Result = s.result(ctx, rec)
		if rec.Usage != nil {
			total := rec.Usage.Total.Clone()
			st.Usage = &total
		}
	}
	return st
}

// result is a finished child's answer: its output, or, when that is empty
// (a trailing empty assistant message, deepagents #3406), the last
// non-empty assistant text the run wrote.
func (s *Service) result(ctx context.Context, rec *protocol.Run) string {
	if rec.Output != nil && strings.TrimSpace(rec.Output.Content) != "" {
		return rec.Output.Content
	}
	th, _, err := s.stores.Threads.Get(ctx, rec.Tenant, rec.ThreadID)
	if err != nil || th.Head == "" {
		return ""
	}
	st, _, err := s.stores.Checkpoints.Load(ctx, rec.Tenant, rec.ThreadID, th.Head)
	if err != nil {
		return ""
	}
	for i := len(st.Messages) - 1; i >= 0; i-- {
		m := st.Messages[i]
		if id, _ := m.Meta["run_id"].(string); id != rec.RunID && id != "" {
			break
		}
		if m.Role == model.RoleAssistant && strings.TrimSpace(m.Content) != "" {
			return m.Content
		}
	}
	return ""
}

// SubagentStatus reads a child's status, with its last few steps.
func (s *Service) SubagentStatus(ctx context.Context, tenant string, q protocol.SubagentQuery) (*protocol.SubagentStatus, error) {
	rec, err := s.child(ctx, tenant, q)
	if err != nil {
		return nil, err
	}
	st := s.view(ctx, rec)
	st.Progress = s.progress(ctx, rec, progressLines)
	return st, nil
}

// CancelSubagent cancels a child through the run cancel protocol and
// answers its status after; a finished child is answered as it is.
func (s *Service) CancelSubagent(ctx context.Context, tenant string, q protocol.SubagentQuery) (*protocol.SubagentStatus, error) {
	rec, err := s.child(ctx, tenant, q)
	if err != nil {
		return nil, err
	}
	if !rec.Status.Terminal() {
		if err := s.cancel(ctx, tenant, rec.ThreadID, rec.RunID); err != nil {
			return nil, err
		}
		if rec, err = s.read(ctx, tenant, q.RunID); err != nil {
			return nil, err
		}
	}
	return s.view(ctx, rec), nil
}

// cancel sends P.ctl.<tenant>.<thread>.<run>.cancel and waits for its
// reply; a run that finished meanwhile is not an error.
func (s *Service) cancel(ctx context.Context, tenant, thread, run string) error {
	ctx, done := context.WithTimeout(ctx, 30*time.Second)
	defer done()
	reply, err := s.nc.RequestWithContext(ctx, s.names.CancelSubject(tenant, thread, run), nil)
	if err != nil {
		return fmt.Errorf("cancel run %s: %w", run, err)
	}
	switch code := reply.Header.Get(micro.ErrorCodeHeader); code {
	case "", "409":
		return nil
	default:
		return fmt.Errorf("cancel run %s: %s %s", run, code, reply.Header.Get(micro.ErrorHeader))
	}
}

// CancelChildren cancels, without waiting, every child of a run that may
// still be running. The worker calls it when the run ends: a child's
// answer only goes to the run that started it.
func CancelChildren(nc *nats.Conn, names bus.Names, tenant string, children []middleware.ChildRun, log *zap.Logger) {
	for _, c := range children {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			reply, err := nc.RequestWithContext(ctx, names.CancelSubject(tenant, c.ThreadID, c.RunID), nil)
			if err != nil {
				if log != nil && !errors.Is(err, nats.ErrConnectionClosed) {
					log.Warn("could not cancel a subagent run", zap.String("child_run_id", c.RunID), zap.Error(err))
				}
				return
			}
			if log != nil && reply.Header.Get(micro.ErrorCodeHeader) == "" {
				log.Info("subagent run cancelled with its parent", zap.String("child_run_id", c.RunID), zap.String("child_thread_id", c.ThreadID))
			}
		}()
	}
}

// AwaitSubagent waits until a child ends or timeout passes.
func (s *Service) AwaitSubagent(ctx context.Context, tenant string, q protocol.SubagentQuery, timeout time.Duration, progress func(string)) (*protocol.SubagentStatus, error) {
	rec, err := s.child(ctx, tenant, q)
	if err != nil {
		return nil, err
	}
	if rec.Status.Terminal() {
		return s.view(ctx, rec), nil
	}
	if progress != nil {
		stop := s.follow(rec, progress)
		defer stop()
	}
	type outcome struct {
		rec      *protocol.Run
		timedOut bool
		err      error
	}
	ch := make(chan outcome, 1)
	cancel, err := s.hub.add(rec.Tenant, rec.ThreadID, rec.RunID, timeout, func(r *protocol.Run, timedOut bool, err error) {
		ch <- outcome{r, timedOut, err}
	})
	if err != nil {
		return nil, err
	}
	select {
	case o := <-ch:
		if o.err != nil {
			return nil, o.err
		}
		st := s.view(ctx, o.rec)
		st.TimedOut = o.timedOut
		return st, nil
	case <-ctx.Done():
		cancel()
		return nil, ctx.Err()
	}
}
