// Package remotetools finds the tools that NATS clients serve as micro
// service endpoints ("remote tools", in any language) and exposes them as
// tools.Tool, named "remote__<name>". It owns discovery ($SRV.INFO with a
// short gather window, periodically and on demand), the tenant scoping of
// what it found, and the request/reply of a call. It does not decide which
// agent may use which tool (profiles do, through agent.ToolSource), and
// serves nothing itself.
//
// The contract a tool server follows (docs/protocol.md, "Remote tools"):
// a micro service whose metadata holds natsagent=tools, with one endpoint
// per tool on the subject P.tools.<tenant>.<name>; the endpoint's metadata
// holds description, schema (the JSON schema of the arguments, as a JSON
// string) and optionally timeout_ms. A request carries the arguments as its
// body and the run's identity in Natsagent-* headers; the reply body is the
// result text, and the micro error headers make an error result.
package remotetools

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/tools"
)

// Prefix starts the name the model sees for every remote tool. Built-in
// tools never hold "__", and MCP tools are "<server>__<tool>": a fixed
// prefix keeps the three apart and tells the model and the operator that a
// call leaves the worker. Settings that name tools (tool_exclusion,
// tool_approval, tool_search) use this name.
const Prefix = "remote__"

// EntryPrefix starts a profile's tools entry that selects remote tools:
// "remote:<name>", "remote:<prefix>*" or Wildcard. A separate spelling
// from the model's name, because "remote__*" would read as the tools of an
// MCP server named "remote".
const EntryPrefix = "remote:"

// Wildcard in a profile's tools selects every remote tool of the run's
// tenant.
const Wildcard = EntryPrefix + "*"

// MaxNameLen is the longest endpoint name: "remote__" and the name must fit
// the 64 characters model providers accept for a tool name.
const MaxNameLen = 64 - len(Prefix)

// The service-level marker: a micro service whose metadata holds
// MetaService=ServiceTools serves natsagent tools; workers ignore every
// other service.
const (
	MetaService  = "natsagent"
	ServiceTools = "tools"
)

// Endpoint metadata keys.
const (
	// MetaDescription is the tool's description for the model (required).
	MetaDescription = "description"
	// MetaSchema is the JSON schema of the arguments, a JSON object with
	// "type":"object", written as a JSON string (default: no arguments).
	MetaSchema = "schema"
	// MetaTimeout bounds a call in milliseconds (default: the worker's
	// remote_tools.call_timeout).
	MetaTimeout = "timeout_ms"
)

// Headers of a call request.
const (
	HeaderTenant   = "Natsagent-Tenant"
	HeaderThread   = "Natsagent-Thread"
	HeaderRun      = "Natsagent-Run"
	HeaderUser     = "Natsagent-User"
	HeaderToolCall = "Natsagent-Tool-Call-Id"
	// HeaderDeadline is when the caller stops waiting (RFC 3339, UTC): a
	// tool may give up on work nobody will read.
	HeaderDeadline = "Natsagent-Deadline"
)

// Defaults of Options.
const (
	DefaultRefreshInterval = 30 * time.Second
	DefaultWindow          = 500 * time.Millisecond
	DefaultCallTimeout     = 30 * time.Second
	// MaxTimeout is the largest timeout_ms an endpoint may ask for.
	MaxTimeout = time.Hour
)

// minRefreshGap spaces discoveries asked for on the refresh subject, so a
// burst of requests costs one $SRV.INFO round per worker.
const minRefreshGap = time.Second

// missesToDrop is how many discoveries in a row a tool may be missing from
// before it is dropped: one reply slower than the window must not make a
// tool flicker out of the runs' tool lists.
const missesToDrop = 2

// Options are the settings of a Catalog; zero values take the defaults.
type Options struct {
	// Names gives the subject prefix (default bus.DefaultNames()).
	Names  bus.Names
	Logger *zap.Logger
	// RefreshInterval is the period of discovery.
	RefreshInterval time.Duration
	// Window is how long one discovery gathers the services' answers.
	Window time.Duration
	// CallTimeout bounds a call whose endpoint sets no timeout_ms.
	CallTimeout time.Duration
}

// Catalog is what the latest discoveries found, by tenant. It is safe for
// concurrent use; a run takes a snapshot of its tenant's tools when it is
// prepared, so its tool list never changes under it.
type Catalog struct {
	nc   *nats.Conn
	opts Options
	log  *zap.Logger

	mu     sync.RWMutex
	tools  map[key]*Tool
	misses map[key]int
	// byTenant is tools indexed for Tools, rebuilt when tools changes.
	byTenant map[string][]tools.Tool
	// issues are the problems logged by the last discovery, each logged
	// once while it lasts.
	issues map[string]bool

	// refreshing serialises discoveries.
	refreshing sync.Mutex

	trigger  chan struct{}
	stopOnce sync.Once
	stop     context.CancelFunc
	done     chan struct{}
	sub      *nats.Subscription
}

type key struct{ tenant, name string }

// New returns an empty catalog that discovers and calls over nc. Start
// begins discovery.
func New(nc *nats.Conn, opts Options) *Catalog {
	if opts.Names.Prefix == "" {
		opts.Names = bus.DefaultNames()
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.RefreshInterval <= 0 {
		opts.RefreshInterval = DefaultRefreshInterval
	}
	if opts.Window <= 0 {
		opts.Window = DefaultWindow
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	return &Catalog{
		nc: nc, opts: opts, log: opts.Logger.Named("remotetools"),
		tools: make(map[key]*Tool), misses: make(map[key]int), issues: make(map[string]bool),
		trigger: make(chan struct{}, 1),
	}
}

// Start runs a first discovery, so the runs right after start see the tools
// already served, then discovers every RefreshInterval and whenever a
// message arrives on the refresh subject (P.tools.refresh), until Stop. A
// failed discovery is logged and retried at the next tick, never fatal.
func (c *Catalog) Start(ctx context.Context) error {
	if err := c.Refresh(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		c.log.Warn("remote tool discovery failed; retrying at the next refresh", zap.Error(err))
	}
	sub, err := c.nc.Subscribe(c.opts.Names.ToolsRefreshSubject(), func(*nats.Msg) { c.requestRefresh() })
	if err != nil {
		return err
	}
	// Once Start returns, a refresh request is heard: the server has the
	// subscription.
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = c.nc.FlushWithContext(fctx)
	cancel()
	if err != nil {
		_ = sub.Unsubscribe()
		return err
	}
	loopCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.sub, c.stop, c.done = sub, cancel, make(chan struct{})
	go c.loop(loopCtx)
	return nil
}

// Stop ends discovery. Tools already handed to runs keep working: calls
// only need the connection.
func (c *Catalog) Stop() {
	c.stopOnce.Do(func() {
		if c.stop == nil {
			return
		}
		_ = c.sub.Unsubscribe()
		c.stop()
		<-c.done
	})
}

func (c *Catalog) requestRefresh() {
	select {
	case c.trigger <- struct{}{}:
	default:
	}
}

func (c *Catalog) loop(ctx context.Context) {
	defer close(c.done)
	tick := time.NewTicker(c.opts.RefreshInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-c.trigger:
		}
		rctx, cancel := context.WithTimeout(ctx, c.opts.Window+10*time.Second)
		if err := c.Refresh(rctx); err != nil && ctx.Err() == nil {
			c.log.Warn("remote tool discovery failed; retrying at the next refresh", zap.Error(err))
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-time.After(minRefreshGap):
		}
	}
}

// Select maps a profile's tools entry "remote:<name>" or
// "remote:<prefix>*" to the model's names it selects ("remote__<name>",
// "remote__<prefix>*"); other entries are not the catalog's.
// agent.ToolSource.
func (c *Catalog) Select(entry string) (string, bool) {
	rest, ok := strings.CutPrefix(entry, EntryPrefix)
	if !ok {
		return "", false
	}
	return Prefix + rest, true
}

// Claims reports whether name is in the remote tools' namespace.
// agent.ToolSource.
func (c *Catalog) Claims(name string) bool { return strings.HasPrefix(name, Prefix) }

// Tools lists the remote tools of tenant, sorted by name. agent.ToolSource.
func (c *Catalog) Tools(tenant string) []tools.Tool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return slices.Clone(c.byTenant[tenant])
}

// index rebuilds byTenant; c.mu is held.
func (c *Catalog) index() {
	by := make(map[string][]tools.Tool)
	for k, t := range c.tools {
		by[k.tenant] = append(by[k.tenant], t)
	}
	for _, ts := range by {
		slices.SortFunc(ts, func(a, b tools.Tool) int { return cmp.Compare(a.Spec().Name, b.Spec().Name) })
	}
	c.byTenant = by
}

// Refresh runs one discovery now and updates the catalog: new tools are
// added, changed ones replaced, and tools missing from two discoveries in a
// row dropped. It returns once the gather window passed. An error (no
// connection) leaves the catalog as it was.
func (c *Catalog) Refresh(ctx context.Context) error {
	c.refreshing.Lock()
	defer c.refreshing.Unlock()
	infos, err := c.gather(ctx)
	if err != nil {
		return err
	}
	found, refused, issues := c.build(infos)
	c.apply(found, refused, issues)
	return nil
}

// apply installs a discovery's result, logging what changed.
func (c *Catalog) apply(found map[key]*Tool, refused map[key]bool, issues []issue) {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := make(map[string]bool, len(issues))
	for _, is := range issues {
		seen[is.id] = true
		if !c.issues[is.id] {
			c.log.Warn(is.msg, is.fields...)
		}
	}
	c.issues = seen
	changed := false
	defer func() {
		if changed {
			c.index()
		}
	}()
	for k, t := range found {
		delete(c.misses, k)
		prev := c.tools[k]
		switch {
		case prev == nil:
			c.log.Info("remote tool available", zap.String("tenant", k.tenant), zap.String("tool", t.spec.Name), zap.String("service", t.service))
		case !prev.same(t):
			c.log.Info("remote tool changed", zap.String("tenant", k.tenant), zap.String("tool", t.spec.Name), zap.String("service", t.service))
		default:
			// Unchanged: keep the value runs already hold.
			continue
		}
		c.tools[k] = t
		changed = true
	}
	for k, t := range c.tools {
		if found[k] != nil {
			continue
		}
		if !refused[k] {
			c.misses[k]++
			if c.misses[k] < missesToDrop {
				continue
			}
		}
		delete(c.tools, k)
		delete(c.misses, k)
		changed = true
		c.log.Info("remote tool gone", zap.String("tenant", k.tenant), zap.String("tool", t.spec.Name), zap.String("service", t.service))
	}
}
