package natsagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/submit"
)

// ErrNotFound is returned for a run, thread or file the tenant does not
// have (or no longer has: records expire with the retention settings).
var ErrNotFound = errors.New("not found")

// ErrRunIDTaken is returned by [Client.Submit] for a run id the tenant
// already used for another request (another thread's run, or a request
// that is gone and left no record). Nothing was queued: choose another id.
var ErrRunIDTaken = errors.New("run id already taken")

// DefaultClientName is the Natsagent-Submitter header of a client's run
// requests when ClientConfig.Name is empty.
const DefaultClientName = "natsagent-go"

// ClientConfig configures a [Client]; the zero value (or nil) talks to the
// deployment with prefix "agent" as tenant "default".
type ClientConfig struct {
	// Prefix of the deployment's subjects, streams and buckets ("":
	// "agent").
	Prefix string
	// Tenant every call acts as ("": "default"). With tenants in NATS
	// accounts of their own, the account decides and this must match it.
	Tenant string
	// MaxRequestBytes bounds an encoded run request as the workers do
	// (0: 256 KiB, the default of nats.max_request_bytes).
	MaxRequestBytes int
	// Name names the client in the Natsagent-Submitter header of its run
	// requests, for the workers' logs ("": DefaultClientName). The header
	// also makes the worker announce each run: its first event is
	// run.queued, as for a run submitted through the gateway.
	Name string
}

// Client starts and follows runs over NATS. It speaks the wire protocol
// only (docs/protocol.md): it publishes run requests and compaction jobs,
// reads events from the events stream, sends cancel and delete requests,
// and reads records, state, files and usage from the KV buckets and the
// object store, never writing them. It is safe for concurrent use. The
// natsagent command's client commands are built on it.
type Client struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	names  bus.Names
	tenant string
	maxReq int
	name   string
	stores *kv.Stores
}

// NewClient binds the deployment's streams and buckets on nc, which stays
// yours to close. It fails when the deployment is not there (no worker or
// gateway has provisioned it yet).
func NewClient(nc *nats.Conn, cfg *ClientConfig) (*Client, error) {
	if nc == nil {
		return nil, errors.New("natsagent.NewClient: nil NATS connection")
	}
	if cfg == nil {
		cfg = &ClientConfig{}
	}
	names, err := bus.NewNames(cfg.Prefix)
	if err != nil {
		return nil, fmt.Errorf("natsagent.NewClient: prefix: %w", err)
	}
	tenant := cfg.Tenant
	if tenant == "" {
		tenant = protocol.DefaultTenant
	}
	if err := protocol.CheckToken("tenant", tenant); err != nil {
		return nil, fmt.Errorf("natsagent.NewClient: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stores, err := kv.Open(ctx, js, names)
	if err != nil {
		return nil, fmt.Errorf("natsagent.NewClient: no natsagent deployment with prefix %q (start a worker or the gateway once: they create it): %w", names.Prefix, err)
	}
	maxReq := cfg.MaxRequestBytes
	if maxReq <= 0 {
		maxReq = protocol.DefaultMaxRequestBytes
	}
	name := cfg.Name
	if name == "" {
		name = DefaultClientName
	}
	return &Client{nc: nc, js: js, names: names, tenant: tenant, maxReq: maxReq, name: name, stores: stores}, nil
}

// MaxRequestBytes is the bound on an encoded run request the client
// checks, as the workers do.
func (c *Client) MaxRequestBytes() int { return c.maxReq }

// Tenant is the tenant the client acts as.
func (c *Client) Tenant() string { return c.tenant }

// UserInput is the input of a run that says text as the user.
func UserInput(text string) *RunInput {
	return &RunInput{Messages: []Message{{Role: model.RoleUser, Content: text}}}
}

// ImageInput is the input of one user message of text and images (PNG,
// JPEG, GIF or WebP bytes). The images are stored first in the thread's
// workdir, named by their SHA-256, and the message references them: a
// run request never carries image bytes. The worker sends them to the
// model as image parts. It needs a deployment that keeps files in NATS.
func (c *Client) ImageInput(ctx context.Context, thread, text string, images ...[]byte) (*RunInput, error) {
	wd, err := c.workdir(ctx, thread)
	if err != nil {
		return nil, err
	}
	m, err := submit.ImageMessage(ctx, wd, text, images...)
	if err != nil {
		return nil, fmt.Errorf("natsagent: %w", err)
	}
	return &RunInput{Messages: []Message{m}}, nil
}

// Submitted is a run request the runs stream stored.
type Submitted struct {
	RunID    string
	ThreadID string
	// Sequence is the request's sequence in the runs stream.
	Sequence uint64
	// Duplicate says the stream already held a request with this run id
	// (a retry): nothing new was queued.
	Duplicate bool
}

// Submit publishes a run request and returns once the runs stream stored
// it. An empty RunID gets a new one; Tenant is the client's (a request
// naming another tenant is refused), and a request may not carry a
// Principal or a Parent: those come from authentication and from the
// subagent service. Submitting the same request again
// (same run id) is safe: the stream keeps one copy and answers Duplicate.
// A run id the tenant used for another request is refused with
// [ErrRunIDTaken] when the client can tell (the stream still holds the
// other request, or a record names another thread); otherwise the worker
// refuses it (the run ends error).
func (c *Client) Submit(ctx context.Context, req RunRequest) (*Submitted, error) {
	if req.Tenant != "" && req.Tenant != c.tenant {
		return nil, fmt.Errorf("natsagent: the request names tenant %q; this client acts as %q", req.Tenant, c.tenant)
	}
	// Identity comes from authentication: the submitter that
	// authenticated the caller writes the principal, and the subagent
	// service the parent link; a client never does.
	if req.Principal != nil {
		return nil, errors.New("natsagent: a run request's principal is set by the submitter that authenticated the caller, not by the client")
	}
	if req.Parent != nil {
		return nil, errors.New("natsagent: a run request's parent is set by the subagent service; start subagents through an agent's task tool")
	}
	if req.RunID == "" {
		req.RunID = "run-" + uuid.NewString()
	}
	if c.tenant != protocol.DefaultTenant {
		req.Tenant = c.tenant
	}
	if err := protocol.CheckToken("thread_id", req.ThreadID); err != nil {
		return nil, err
	}
	data, err := json.Marshal(&req)
	if err != nil {
		return nil, err
	}
	// The workers' own check, so a request they would dead-letter fails
	// here with the same message.
	if _, err := protocol.DecodeRunRequestFor(data, c.maxReq, c.tenant, req.ThreadID); err != nil {
		return nil, err
	}
	m := nats.NewMsg(c.names.RunSubject(c.tenant, req.ThreadID))
	m.Data = data
	m.Header.Set(jetstream.MsgIDHeader, protocol.RunMsgID(c.tenant, req.RunID))
	m.Header.Set(protocol.HeaderSubmitter, c.name)
	ack, err := bus.PublishMsg(ctx, c.js, m)
	if err != nil {
		return nil, fmt.Errorf("natsagent: submit run %s: %w", req.RunID, err)
	}
	if ack.Duplicate {
		if err := c.checkDuplicate(ctx, req.ThreadID, req.RunID, ack.Sequence); err != nil {
			return nil, err
		}
	}
	return &Submitted{RunID: req.RunID, ThreadID: req.ThreadID, Sequence: ack.Sequence, Duplicate: ack.Duplicate}, nil
}

// checkDuplicate tells a retry of this run from another request under its
// message id (docs/protocol.md 2.2): the stored message at seq must be
// this thread's request, or, once a worker consumed it, the run's record
// must be this thread's. A read the client may not make (a tenant account
// without access to the runs stream, whose submit service checked
// already) leaves the answer to the worker.
func (c *Client) checkDuplicate(ctx context.Context, thread, run string, seq uint64) error {
	m, err := bus.GetMsgFromLeader(ctx, c.js, c.names.RunsStream(), bus.MsgQuery{Seq: seq})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		rec, _, err := c.stores.Runs.GetFromLeader(ctx, c.tenant, run)
		switch {
		case errors.Is(err, kv.ErrNotFound):
			return fmt.Errorf("%w: run %s was submitted before (stream sequence %d) and left no run record; choose another run id", ErrRunIDTaken, run, seq)
		case err != nil:
			return nil
		case rec.ThreadID != thread:
			return fmt.Errorf("%w: run id %s is already used by a run on thread %s; choose another run id", ErrRunIDTaken, run, rec.ThreadID)
		}
		return nil
	}
	if err != nil {
		return nil
	}
	if m.Subject != c.names.RunSubject(c.tenant, thread) || m.Header.Get(jetstream.MsgIDHeader) != protocol.RunMsgID(c.tenant, run) {
		if other, ok := strings.CutPrefix(m.Subject, c.names.RunSubject(c.tenant, "")); ok && m.Header.Get(jetstream.MsgIDHeader) == protocol.RunMsgID(c.tenant, run) {
			return fmt.Errorf("%w: run id %s is already used by a run on thread %s; choose another run id", ErrRunIDTaken, run, other)
		}
		return fmt.Errorf("%w: the runs stream holds another request under the message id of run %s (stream sequence %d); choose another run id", ErrRunIDTaken, run, seq)
	}
	return nil
}

// Steer submits text as a run that preempts the thread's active run at its
// next safe boundary (multitask strategy "steer").
func (c *Client) Steer(ctx context.Context, thread, text string) (*Submitted, error) {
	return c.Submit(ctx, RunRequest{ThreadID: thread, Input: UserInput(text), MultitaskStrategy: protocol.StrategySteer})
}

// Resume continues an interrupted thread with value as the interrupt's
// answer: a clarification's answer as a string, or what a custom
// middleware's interrupt reads.
func (c *Client) Resume(ctx context.Context, thread string, value any) (*Submitted, error) {
	raw, err := json.Marshal(value)
	if err != nil {
		return nil, fmt.Errorf("natsagent: resume value: %w", err)
	}
	return c.Submit(ctx, RunRequest{ThreadID: thread, Command: &RunCommand{Resume: raw}})
}

// Approve answers the tool calls an interrupted thread waits for, one
// decision per call in the order of the interrupt's action requests. The
// decisions are checked against the open interrupt first, as the worker
// checks them.
func (c *Client) Approve(ctx context.Context, thread string, decisions ...Decision) (*Submitted, error) {
	st, err := c.State(ctx, thread)
	if err != nil {
		return nil, err
	}
	var open protocol.Interrupt
	if ok, _ := st.Value(protocol.InterruptValue, &open); !ok || open.Kind != protocol.InterruptApproval {
		return nil, fmt.Errorf("natsagent: thread %s waits for no approval", thread)
	}
	if err := protocol.CheckDecisions(&open, decisions); err != nil {
		return nil, err
	}
	return c.Resume(ctx, thread, map[string]any{"decisions": decisions})
}

// Cancel cancels a pending or running run and returns its status then
// (cancelled, or running when the worker could not stop it within 15 s:
// the cancel still applies). A finished run is refused.
func (c *Client) Cancel(ctx context.Context, thread, run string) (Status, error) {
	if err := checkIDs(thread, run); err != nil {
		return "", err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	subject := c.names.CancelSubject(c.tenant, thread, run)
	msg, err := c.nc.RequestWithContext(ctx, subject, nil)
	if errors.Is(err, nats.ErrNoResponders) {
		return "", fmt.Errorf("natsagent: no worker serves cancel requests on %s: start a worker", subject)
	}
	if err != nil {
		return "", fmt.Errorf("natsagent: cancel run %s: %w", run, err)
	}
	if err := serviceError(msg); err != nil {
		if errors.Is(err, ErrNotFound) {
			return "", err
		}
		return "", fmt.Errorf("natsagent: cancel run %s: %w", run, err)
	}
	var reply protocol.CancelReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return "", fmt.Errorf("natsagent: decode the cancel reply: %w", err)
	}
	return reply.Status, nil
}

// Run reads a run as clients see it (docs/protocol.md 1.6): a running
// run's record stays pending, or is missing until the run ends, and its
// thread's lease says it runs. A run without a record is looked for on
// the tenant's threads, then among the requests no worker has taken yet
// (status pending).
func (c *Client) Run(ctx context.Context, run string) (*Run, error) {
	if err := protocol.CheckToken("run id", run); err != nil {
		return nil, err
	}
	rec, err := c.stores.FindRunView(ctx, c.tenant, run)
	if errors.Is(err, kv.ErrNotFound) {
		// Any replica answers a read, and one may not have a record
		// created a moment ago: the leader decides, at once (a run
		// without a record is the usual case, not a write in flight).
		rec, _, err = c.stores.Runs.GetFromLeader(ctx, c.tenant, run)
	}
	if errors.Is(err, kv.ErrNotFound) {
		if rec, err = submit.QueuedRun(ctx, c.js, c.names, c.tenant, "", run); err == nil && rec == nil {
			err = fmt.Errorf("%w: run %s in tenant %s", ErrNotFound, run, c.tenant)
		}
	}
	return rec, err
}

// Thread reads a thread record. A thread has one once its first run
// started.
func (c *Client) Thread(ctx context.Context, thread string) (*Thread, error) {
	if err := protocol.CheckToken("thread id", thread); err != nil {
		return nil, err
	}
	// The leader answers at once: a missing thread is not a write in
	// flight (GetLatest would wait for one, 2 s a miss).
	th, _, err := c.stores.Threads.GetFromLeader(ctx, c.tenant, thread)
	if errors.Is(err, kv.ErrNotFound) {
		return nil, fmt.Errorf("%w: thread %s in tenant %s", ErrNotFound, thread, c.tenant)
	}
	return th, err
}

// Threads lists the tenant's thread records.
func (c *Client) Threads(ctx context.Context) ([]*Thread, error) {
	return c.stores.Threads.List(ctx, c.tenant)
}

// Runs lists a thread's run records, oldest first as the thread indexed
// them; runs whose records are gone are skipped.
func (c *Client) Runs(ctx context.Context, thread string) ([]*Run, error) {
	if err := protocol.CheckToken("thread id", thread); err != nil {
		return nil, err
	}
	th, _, err := c.stores.Threads.Get(ctx, c.tenant, thread)
	if err != nil && !errors.Is(err, kv.ErrNotFound) {
		return nil, err
	}
	return c.stores.ThreadRuns(ctx, c.tenant, thread, th)
}

// State reads a thread's current state: its messages and the values the
// middlewares keep (todos, title, the open interrupt).
func (c *Client) State(ctx context.Context, thread string) (*State, error) {
	th, err := c.Thread(ctx, thread)
	if err != nil {
		return nil, err
	}
	st, _, err := c.stores.Checkpoints.Load(ctx, c.tenant, thread, th.Head)
	if err != nil {
		return nil, fmt.Errorf("natsagent: state of thread %s: %w", thread, err)
	}
	return st, nil
}

// FileInfo describes a file of a thread's workdir.
type FileInfo = files.Info

// Files lists every file of a thread's workdir, sorted by path. It needs a
// deployment that keeps files in NATS (files.backend: nats, the default).
func (c *Client) Files(ctx context.Context, thread string) ([]FileInfo, error) {
	wd, err := c.workdir(ctx, thread)
	if err != nil {
		return nil, err
	}
	var out []FileInfo
	err = wd.Walk(ctx, "/", func(fi files.Info) error {
		out = append(out, fi)
		return nil
	})
	return out, err
}

// ReadFile reads a file of a thread's workdir.
func (c *Client) ReadFile(ctx context.Context, thread, path string) ([]byte, error) {
	wd, err := c.workdir(ctx, thread)
	if err != nil {
		return nil, err
	}
	data, err := wd.Read(ctx, path)
	if errors.Is(err, files.ErrNotFound) {
		return nil, fmt.Errorf("%w: file %s of thread %s", ErrNotFound, path, thread)
	}
	return data, err
}

func (c *Client) workdir(ctx context.Context, thread string) (files.Workdir, error) {
	if err := protocol.CheckToken("thread id", thread); err != nil {
		return nil, err
	}
	obj, err := c.js.ObjectStore(ctx, c.names.FilesBucket())
	if err != nil {
		return nil, fmt.Errorf("natsagent: the deployment keeps no files in NATS (object store %s): %w", c.names.FilesBucket(), err)
	}
	index, err := c.js.KeyValue(ctx, c.names.ThreadsBucket())
	if err != nil {
		return nil, err
	}
	return files.NewObjectStore(obj, index, c.tenant, thread), nil
}

// RunUsage reads a run's token usage (its own and its subagents').
func (c *Client) RunUsage(ctx context.Context, run string) (*RunUsage, error) {
	rec, err := c.Run(ctx, run)
	if err != nil {
		return nil, err
	}
	return c.stores.Usage.RunOf(ctx, rec)
}

// ThreadUsage reads a thread's token usage over all its runs.
func (c *Client) ThreadUsage(ctx context.Context, thread string) (*ThreadUsage, error) {
	th, err := c.Thread(ctx, thread)
	if err != nil {
		return nil, err
	}
	return c.stores.Usage.ThreadOf(ctx, th)
}

func checkIDs(thread, run string) error {
	if err := protocol.CheckToken("thread id", thread); err != nil {
		return err
	}
	return protocol.CheckToken("run id", run)
}
