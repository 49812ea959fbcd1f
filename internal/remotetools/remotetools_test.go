package remotetools_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/remotetools"
	"github.com/natsagent/natsagent/internal/tools"
)

// endpoint is one tool a test server serves.
type endpoint struct {
	name    string // the micro endpoint's name
	subject string
	meta    map[string]string
	handler micro.HandlerFunc
}

// tool is a valid endpoint for tenant's tool name.
func tool(tenant, name, desc string, handler micro.HandlerFunc) endpoint {
	return endpoint{name: name, subject: "agent.tools." + tenant + "." + name,
		meta: map[string]string{remotetools.MetaDescription: desc}, handler: handler}
}

func (e endpoint) with(k, v string) endpoint {
	meta := map[string]string{}
	for mk, mv := range e.meta {
		meta[mk] = mv
	}
	meta[k] = v
	e.meta = meta
	return e
}

func echo(req micro.Request) { _ = req.Respond(req.Data()) }

// serve starts a natsagent tool service on its own connection, as a tool
// written by someone else would.
func serve(t *testing.T, srv *natstest.Server, service, version string, eps ...endpoint) *served {
	t.Helper()
	return serveWith(t, srv, micro.Config{Name: service, Version: version,
		Metadata: map[string]string{remotetools.MetaService: remotetools.ServiceTools}}, eps...)
}

// served is a running tool service.
type served struct {
	svc micro.Service
	nc  *nats.Conn
}

// stop stops the service and waits until the server has forgotten its
// subscriptions.
func (s *served) stop(t *testing.T) {
	t.Helper()
	if err := s.svc.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := s.nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func serveWith(t *testing.T, srv *natstest.Server, cfg micro.Config, eps ...endpoint) *served {
	t.Helper()
	nc := srv.Connect()
	svc, err := micro.AddService(nc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range eps {
		h := e.handler
		if h == nil {
			h = echo
		}
		if err := svc.AddEndpoint(e.name, h, micro.WithEndpointSubject(e.subject), micro.WithEndpointMetadata(e.meta)); err != nil {
			t.Fatal(err)
		}
	}
	// The server has the service's subscriptions before the test looks
	// for it.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	return &served{svc: svc, nc: nc}
}

func newCatalog(t *testing.T, srv *natstest.Server, log *zap.Logger) *remotetools.Catalog {
	t.Helper()
	if log == nil {
		log = zap.NewNop()
	}
	return remotetools.New(srv.Connect(), remotetools.Options{Logger: log, Window: 150 * time.Millisecond, CallTimeout: 5 * time.Second})
}

func refresh(t *testing.T, c *remotetools.Catalog) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
}

// discover refreshes c until tenant's tools are want (names joined by
// commas, sorted) and fails the test if they never are. A discovery
// waits its 150 ms window for answers; on a starved machine a service's
// answer can come later, and only a later discovery sees it.
func discover(t *testing.T, c *remotetools.Catalog, tenant, want string) {
	t.Helper()
	natstest.WaitFor(t, natstest.Patience, "the catalog of "+tenant+" to be "+want, func() bool {
		refresh(t, c)
		return names(c.Tools(tenant)) == want
	})
}

func names(ts []tools.Tool) string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Spec().Name
	}
	return strings.Join(out, ",")
}

func find(ts []tools.Tool, name string) tools.Tool {
	for _, t := range ts {
		if t.Spec().Name == name {
			return t
		}
	}
	return nil
}

// Discovery finds the tools of marked services only, per tenant, with the
// description, schema and timeout of their metadata.
func TestDiscovery(t *testing.T) {
	srv := natstest.Start(t)
	schema := `{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`
	serve(t, srv, "weather", "1.0.0",
		tool("acme", "weather", "Current weather of a city.", nil).with(remotetools.MetaSchema, schema).with(remotetools.MetaTimeout, "2500"),
		tool("acme", "alerts", "Weather alerts.", nil),
		tool("beta", "weather", "Beta's weather.", nil),
	)
	// A micro service without the marker is someone else's: its
	// endpoints are not tools, whatever their subject.
	serveWith(t, srv, micro.Config{Name: "other", Version: "1.0.0"}, tool("acme", "intruder", "Not a tool.", nil))
	// Another deployment's tools (prefix "staging") are not this one's.
	serve(t, srv, "staging-tools", "1.0.0", endpoint{name: "w", subject: "staging.tools.acme.w", meta: map[string]string{remotetools.MetaDescription: "x"}})

	c := newCatalog(t, srv, nil)
	if got := names(c.Tools("acme")); got != "" {
		t.Fatalf("tools before any discovery: %s", got)
	}
	discover(t, c, "acme", "remote__alerts,remote__weather")
	acme := c.Tools("acme")
	if got := names(acme); got != "remote__alerts,remote__weather" {
		t.Fatalf("acme's tools: %s", got)
	}
	if got := names(c.Tools("beta")); got != "remote__weather" {
		t.Fatalf("beta's tools: %s", got)
	}
	if got := names(c.Tools("gamma")); got != "" {
		t.Fatalf("gamma's tools: %s", got)
	}
	w := find(acme, "remote__weather").(*remotetools.Tool)
	spec := w.Spec()
	if spec.Description != "Current weather of a city." || string(spec.Parameters) != schema {
		t.Errorf("spec %+v", spec)
	}
	if w.Timeout() != 2500*time.Millisecond || w.Subject() != "agent.tools.acme.weather" || w.Tenant() != "acme" {
		t.Errorf("timeout %s subject %s tenant %s", w.Timeout(), w.Subject(), w.Tenant())
	}
	a := find(acme, "remote__alerts").(*remotetools.Tool)
	if string(a.Spec().Parameters) != `{"type":"object","properties":{}}` || a.Timeout() != 5*time.Second {
		t.Errorf("defaults: parameters %s timeout %s", a.Spec().Parameters, a.Timeout())
	}
}

// Endpoints that break the contract are skipped, each with one log line
// naming the problem, while it lasts; the valid ones are found.
func TestInvalidEndpointsSkipped(t *testing.T) {
	srv := natstest.Start(t)
	long := strings.Repeat("x", remotetools.MaxNameLen+1)
	good := tool("acme", "good", "A good tool.", nil)
	bad := []struct {
		ep   endpoint
		want string
	}{
		{tool("acme", long, "Too long a name.", nil), "tool name"},
		{endpoint{name: "wild", subject: "agent.tools.*.wild", meta: map[string]string{remotetools.MetaDescription: "Every tenant."}}, "no wildcards"},
		{endpoint{name: "short", subject: "agent.tools.short", meta: map[string]string{remotetools.MetaDescription: "Three tokens."}}, "the subject is not agent.tools.<tenant>.<name>"},
		{tool("acme", "nodesc", "", nil), `"description" is missing`},
		{tool("acme", "badjson", "Bad schema.", nil).with(remotetools.MetaSchema, `{"type":`), `"schema" is not a JSON object`},
		{tool("acme", "array", "Array schema.", nil).with(remotetools.MetaSchema, `{"type":"array"}`), `"schema" must describe an object`},
		{tool("acme", "slowpoke", "Bad timeout.", nil).with(remotetools.MetaTimeout, "soon"), `"timeout_ms" is "soon"`},
		{tool("acme", "forever", "Too long a timeout.", nil).with(remotetools.MetaTimeout, "3600001"), `"timeout_ms"`},
	}
	eps := []endpoint{good}
	for _, b := range bad {
		eps = append(eps, b.ep)
	}
	serve(t, srv, "mixed", "1.0.0", eps...)
	core, logs := observer.New(zap.InfoLevel)
	c := newCatalog(t, srv, zap.New(core))
	discover(t, c, "acme", "remote__good")
	if got := names(c.Tools("acme")); got != "remote__good" {
		t.Fatalf("acme's tools: %s", got)
	}
	skipped := logs.FilterMessageSnippet("remote tool endpoint skipped").All()
	if len(skipped) != len(bad) {
		t.Fatalf("%d skip lines for %d bad endpoints: %v", len(skipped), len(bad), skipped)
	}
	for _, b := range bad {
		found := false
		for _, e := range skipped {
			if e.ContextMap()["endpoint"] == b.ep.name && strings.Contains(e.Message, b.want) {
				found = true
			}
		}
		if !found {
			t.Errorf("no skip line for endpoint %s saying %q", b.ep.name, b.want)
		}
	}
	refresh(t, c)
	if n := logs.FilterMessageSnippet("remote tool endpoint skipped").Len(); n != len(bad) {
		t.Errorf("a second discovery logged the same problems again: %d lines", n)
	}
}

// A tool served by two different services is refused, with a log line:
// NATS would spread its calls over both, so neither is offered.
func TestCollisionRefused(t *testing.T) {
	srv := natstest.Start(t)
	serve(t, srv, "first", "1.0.0", tool("acme", "lookup", "First lookup.", nil), tool("acme", "mine", "Only mine.", nil))
	core, logs := observer.New(zap.InfoLevel)
	c := newCatalog(t, srv, zap.New(core))
	discover(t, c, "acme", "remote__lookup,remote__mine")
	if got := names(c.Tools("acme")); got != "remote__lookup,remote__mine" {
		t.Fatalf("acme's tools: %s", got)
	}
	serve(t, srv, "second", "1.0.0", tool("acme", "lookup", "Second lookup.", nil))
	discover(t, c, "acme", "remote__mine")
	if got := names(c.Tools("acme")); got != "remote__mine" {
		t.Fatalf("acme's tools with a collision: %s", got)
	}
	refused := logs.FilterMessageSnippet("remote tool refused").All()
	if len(refused) != 1 || refused[0].ContextMap()["tool"] != "remote__lookup" {
		t.Fatalf("refusal lines %v", refused)
	}
}

// Instances of one service that disagree (a rolling upgrade) are one tool:
// the newest version's description is offered.
func TestInstancesNewestVersionWins(t *testing.T) {
	srv := natstest.Start(t)
	serve(t, srv, "lookup", "1.9.0", tool("acme", "lookup", "Old lookup.", nil))
	serve(t, srv, "lookup", "1.10.0", tool("acme", "lookup", "New lookup.", nil))
	c := newCatalog(t, srv, nil)
	// Both instances answer a discovery; under load one answer can miss
	// a window, and the tool is then the one instance that answered.
	natstest.WaitFor(t, natstest.Patience, "one tool with the newest instance's description", func() bool {
		refresh(t, c)
		ts := c.Tools("acme")
		return len(ts) == 1 && ts[0].Spec().Description == "New lookup."
	})
}

// A tool served after the catalog started is found after a refresh asked
// for on the refresh subject, without waiting for the period; a tool whose
// service stopped is dropped after two discoveries without it.
func TestRefreshFindsNewToolsAndDropsGoneOnes(t *testing.T) {
	srv := natstest.Start(t)
	c := remotetools.New(srv.Connect(), remotetools.Options{Window: 100 * time.Millisecond, RefreshInterval: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if got := names(c.Tools("acme")); got != "" {
		t.Fatalf("tools at start: %s", got)
	}
	svc := serve(t, srv, "late", "1.0.0", tool("acme", "late", "Came late.", nil))
	pub := srv.Connect()
	// A discovery waits its 100 ms window for answers; on a starved
	// machine the service's can come later, and only the next request's
	// discovery sees it: ask again until it is found (the period, an hour,
	// never comes).
	natstest.WaitFor(t, natstest.Patience, "the late tool found after refresh requests", func() bool {
		if err := pub.Publish("agent.tools.refresh", nil); err != nil {
			t.Fatal(err)
		}
		return names(c.Tools("acme")) == "remote__late"
	})

	svc.stop(t)
	refresh(t, c)
	if got := names(c.Tools("acme")); got != "remote__late" {
		t.Fatalf("dropped after one discovery without it: %q", got)
	}
	refresh(t, c)
	if got := names(c.Tools("acme")); got != "" {
		t.Fatalf("still there after two discoveries without it: %q", got)
	}
}

// callTool discovers tenant's tool name and calls it as a run would.
func callTool(t *testing.T, ctx context.Context, c *remotetools.Catalog, tenant, name, args string) *tools.Result {
	t.Helper()
	tl := find(c.Tools(tenant), name)
	if tl == nil {
		t.Fatalf("%s has no tool %s: %s", tenant, name, names(c.Tools(tenant)))
	}
	res, err := tl.Call(ctx, &tools.Call{ID: "call-1", Name: name, Args: json.RawMessage(args),
		Env: &tools.Env{Tenant: tenant, Thread: "h1", Run: "r1", User: "ann"}})
	if err != nil {
		t.Fatalf("call returned an error instead of a result: %v", err)
	}
	return res
}

// A call sends the arguments as the body and the run's identity in
// headers; the reply body is the result.
func TestCallRequestAndReply(t *testing.T) {
	srv := natstest.Start(t)
	var mu sync.Mutex
	var got micro.Request
	serve(t, srv, "weather", "1.0.0", tool("acme", "weather", "Weather.", func(req micro.Request) {
		mu.Lock()
		got = req
		mu.Unlock()
		_ = req.Respond([]byte("sunny in Paris"))
	}).with(remotetools.MetaTimeout, "4000"))
	c := newCatalog(t, srv, nil)
	discover(t, c, "acme", "remote__weather")
	before := time.Now()
	res := callTool(t, context.Background(), c, "acme", "remote__weather", `{"city":"Paris"}`)
	if res.Error || res.Content != "sunny in Paris" {
		t.Fatalf("result %+v", res)
	}
	mu.Lock()
	defer mu.Unlock()
	if string(got.Data()) != `{"city":"Paris"}` {
		t.Errorf("body %s", got.Data())
	}
	h := got.Headers()
	for k, want := range map[string]string{
		remotetools.HeaderTenant: "acme", remotetools.HeaderThread: "h1", remotetools.HeaderRun: "r1",
		remotetools.HeaderUser: "ann", remotetools.HeaderToolCall: "call-1",
	} {
		if v := h.Get(k); v != want {
			t.Errorf("header %s = %q, want %q", k, v, want)
		}
	}
	deadline, err := time.Parse(time.RFC3339Nano, h.Get(remotetools.HeaderDeadline))
	if err != nil || deadline.Before(before.Add(3*time.Second)) || deadline.After(time.Now().Add(4*time.Second)) {
		t.Errorf("deadline header %q (%v)", h.Get(remotetools.HeaderDeadline), err)
	}
}

// The micro error headers make an error result with the description and
// the code.
func TestCallErrorHeader(t *testing.T) {
	srv := natstest.Start(t)
	serve(t, srv, "weather", "1.0.0", tool("acme", "weather", "Weather.", func(req micro.Request) {
		_ = req.Error("404", "no such city: Atlantis", nil)
	}))
	c := newCatalog(t, srv, nil)
	discover(t, c, "acme", "remote__weather")
	res := callTool(t, context.Background(), c, "acme", "remote__weather", `{"city":"Atlantis"}`)
	if !res.Error || !strings.Contains(res.Content, "no such city: Atlantis") || !strings.Contains(res.Content, "code 404") {
		t.Fatalf("result %+v", res)
	}
}

// A tool whose server went away answers with an error result at once.
func TestCallNoResponders(t *testing.T) {
	srv := natstest.Start(t)
	svc := serve(t, srv, "weather", "1.0.0", tool("acme", "weather", "Weather.", nil))
	c := newCatalog(t, srv, nil)
	discover(t, c, "acme", "remote__weather")
	svc.stop(t)
	start := time.Now()
	res := callTool(t, context.Background(), c, "acme", "remote__weather", `{}`)
	if !res.Error || !strings.Contains(res.Content, "is not served right now") {
		t.Fatalf("result %+v", res)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("no responders took %s", d)
	}
}

// A tool that does not answer within its timeout_ms is an error result
// after that time, not a hung call.
func TestCallTimeout(t *testing.T) {
	srv := natstest.Start(t)
	release := make(chan struct{})
	defer close(release)
	serve(t, srv, "slow", "1.0.0", tool("acme", "slow", "Slow.", func(req micro.Request) {
		<-release
	}).with(remotetools.MetaTimeout, "200"))
	c := newCatalog(t, srv, nil)
	discover(t, c, "acme", "remote__slow")
	start := time.Now()
	res := callTool(t, context.Background(), c, "acme", "remote__slow", `{}`)
	if !res.Error || !strings.Contains(res.Content, "did not answer within 200ms") {
		t.Fatalf("result %+v", res)
	}
	if d := time.Since(start); d < 200*time.Millisecond || d > 3*time.Second {
		t.Errorf("the call took %s", d)
	}
}

// A cancelled run stops waiting at once; the cancellation is returned as
// an error, for the loop to end the run, not as a tool result.
func TestCallCancelledRunStopsWaiting(t *testing.T) {
	srv := natstest.Start(t)
	release := make(chan struct{})
	defer close(release)
	started := make(chan struct{}, 1)
	serve(t, srv, "slow", "1.0.0", tool("acme", "slow", "Slow.", func(req micro.Request) {
		started <- struct{}{}
		<-release
	}))
	c := newCatalog(t, srv, nil)
	discover(t, c, "acme", "remote__slow")
	cause := errors.New("cancelled by a person")
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		<-started
		cancel(cause)
	}()
	start := time.Now()
	res, err := find(c.Tools("acme"), "remote__slow").Call(ctx, &tools.Call{ID: "c", Name: "remote__slow", Env: &tools.Env{Tenant: "acme"}})
	if !errors.Is(err, cause) || res != nil {
		t.Fatalf("result %+v, error %v", res, err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("stopping took %s", d)
	}
}

// A reply that is not text is an error result.
func TestCallBadReply(t *testing.T) {
	srv := natstest.Start(t)
	serve(t, srv, "binary", "1.0.0", tool("acme", "binary", "Bytes.", func(req micro.Request) {
		_ = req.Respond([]byte{0xff, 0xfe, 0x00})
	}), tool("acme", "empty", "Nothing.", func(req micro.Request) {
		_ = req.Respond(nil)
	}))
	c := newCatalog(t, srv, nil)
	discover(t, c, "acme", "remote__binary,remote__empty")
	if res := callTool(t, context.Background(), c, "acme", "remote__binary", `{}`); !res.Error || !strings.Contains(res.Content, "not UTF-8") {
		t.Fatalf("binary result %+v", res)
	}
	if res := callTool(t, context.Background(), c, "acme", "remote__empty", `{}`); res.Error || res.Content != "The tool returned no content." {
		t.Fatalf("empty result %+v", res)
	}
}

// A tool is called for its own tenant's runs only, even when a run of
// another tenant holds it; the server never sees the call.
func TestCallOtherTenantRefused(t *testing.T) {
	srv := natstest.Start(t)
	var called atomic.Bool
	serve(t, srv, "weather", "1.0.0", tool("acme", "weather", "Weather.", func(req micro.Request) {
		called.Store(true)
		_ = req.Respond([]byte("x"))
	}))
	c := newCatalog(t, srv, nil)
	discover(t, c, "acme", "remote__weather")
	res, err := find(c.Tools("acme"), "remote__weather").Call(context.Background(), &tools.Call{ID: "c", Name: "remote__weather", Env: &tools.Env{Tenant: "beta"}})
	if err != nil || !res.Error || !strings.Contains(res.Content, "not available to this run's tenant") {
		t.Fatalf("result %+v, error %v", res, err)
	}
	if called.Load() {
		t.Fatal("the tool server received another tenant's call")
	}
}

// Profile entries are checked: a name, a prefix with "*", or everything.
func TestCheckEntry(t *testing.T) {
	for _, ok := range []string{"remote:weather", "remote:*", "remote:crm_*"} {
		if err := remotetools.CheckEntry(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"remote:", "remote:a.b", "remote:a*b", "remote:" + strings.Repeat("x", 57), "remote__weather", "weather"} {
		if err := remotetools.CheckEntry(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
