// Package gateway owns natsagent's HTTP + SSE API, shaped after the
// LangGraph Agent Server's threads/runs API so its users feel at home.
//
// The gateway speaks only NATS: it publishes run requests to the runs
// stream, reads run, thread and checkpoint records from KV, replays and
// follows run events with ordered consumers, and sends cancel requests. It
// never executes a run, never takes a thread's lease and never changes a
// run record once a worker may own it; the only records it writes are a
// submitted run's pending record, a run it rejects itself, a new thread,
// and for time travel (a state update, a run from an earlier checkpoint, a
// copy) a checkpoint and the thread's head, moved with a compare-and-set
// only while no run holds or waits for the thread. It also reads and writes threads' workdirs (the files people
// upload and download), through Config.Files.
package gateway

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/crons"
	"github.com/natsagent/natsagent/internal/erase"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/limits"
	"github.com/natsagent/natsagent/internal/metrics"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/policy"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/store"
	"github.com/natsagent/natsagent/internal/submit"
	"github.com/natsagent/natsagent/internal/telemetry"
)

// DefaultMaxBodyBytes bounds a request body when Config sets no limit.
const DefaultMaxBodyBytes = 1 << 20

// Config configures a gateway. Zero values take defaults.
type Config struct {
	// Settings must equal the deployment's provisioning settings.
	Settings bus.Settings
	// MaxBodyBytes bounds every request body (default 1 MiB); a larger
	// body is answered 413.
	MaxBodyBytes int64
	// Logger receives structured logs (default: none).
	Logger *zap.Logger
	// DefaultAgent is the agent of a run that names none (default
	// protocol.DefaultAgent).
	DefaultAgent string
	// Files opens a thread's workdir for the file endpoints; nil means
	// the deployment keeps no files, and they answer 404.
	Files func(tenant, thread string) files.Workdir
	// MaxFileBytes bounds the body of an upload (default
	// files.DefaultMaxFileBytes) instead of MaxBodyBytes; the workdir
	// bounds each file.
	MaxFileBytes int64
	// Images bounds the images of user input (images.go).
	Images ImageLimits
	// APIKeys, when any is set, are required on every route but the
	// health checks, and a request acts as its key's principal (auth.go).
	APIKeys []APIKey
	// JWT, when set, accepts bearer JWTs too (jwt.go).
	JWT *JWT
	// Policy decides what a principal may submit (nil: no role is
	// configured; see policy.Policy).
	Policy *policy.Policy
	// Metrics receives the gateway's measurements (nil: none).
	Metrics metrics.Recorder
	// MetricsHandler, when set, is served at GET /metrics, open like the
	// health checks (operations.md, "Observability").
	MetricsHandler http.Handler
	// Limits applies the tenants' limits to run submissions (limits.go);
	// nil applies none.
	Limits *limits.Limiter
	// Traces records a span per request and per published run request,
	// whose context the request carries to the worker; nil traces
	// nothing.
	Traces trace.TracerProvider
	// WebhookAllowPrivate lets a run's webhook name a loopback or private
	// address (config webhooks.allow_private); refused by default.
	WebhookAllowPrivate bool
	// MaxCronsPerTenant caps each tenant's crons (0:
	// DefaultMaxCronsPerTenant); a create past it is answered 409.
	MaxCronsPerTenant int
	// Graphs are the deployment's lead agent profiles, served as
	// LangGraph graphs and system assistants (assistants.go); none means
	// the default agent alone.
	Graphs []Graph
	// Embedder, when set, gives the store semantic search: items carry
	// vectors of their indexed fields and a search query is ranked by
	// cosine (store.go); nil: a query is a substring match.
	Embedder model.Embedder
	// StoreIndexFields are the fields embedded when a put names none
	// (default ["$"], the whole value).
	StoreIndexFields []string
	// StoreIndexMemory bounds the memory of the store's search index
	// (0: store.DefaultIndexMemory); the least recently searched tenants
	// leave it first (store.IndexOptions).
	StoreIndexMemory int64
}

// Server serves the HTTP API. It keeps no state of its own: any number of
// gateways can serve the same deployment.
type Server struct {
	cfg    Config
	names  bus.Names
	nc     *nats.Conn
	js     jetstream.JetStream
	stores *kv.Stores
	// assistants is nil on a deployment provisioned before it had the
	// bucket: the assistants routes answer 503, system assistants still
	// serve.
	assistants *kv.Assistants
	// store is nil on a deployment provisioned before it had the store
	// bucket: the store routes answer 503.
	items  *store.Store
	pub    *events.Publisher
	queue  *submit.Queue
	runs   jetstream.Stream
	events jetstream.Stream
	log    *zap.Logger
	mux    *http.ServeMux
	eraser *erase.Eraser
	crons  *crons.Store
	auth   *authenticator // nil: no API keys, the API is open
	tracer trace.Tracer   // nil: the gateway does not trace

	// keepAlive is how long an SSE stream may stay silent before a
	// comment is sent, so proxies do not close it.
	keepAlive time.Duration
	// trailWait is how long the stream of a finished run with no stored
	// event waits in silence for its events before it ends with the
	// run.finished built from the record (streamRun).
	trailWait time.Duration
	// testHookTrailing, set by tests only, runs when such a stream
	// starts waiting.
	testHookTrailing func()
	// submitTimeout bounds the NATS round trips of one submission.
	submitTimeout time.Duration
	// cancelTimeout bounds a cancel request.
	cancelTimeout time.Duration
	// indexed holds the tenants whose thread creation index this process
	// checked, and repaired if it was behind (a cache of that check only:
	// any gateway answers the same without it).
	indexed sync.Map
	// statusIndexed holds the tenants whose thread status index this
	// process found complete, or completed (threadorder.go).
	statusIndexed sync.Map
}

// New binds a gateway to a NATS connection. The deployment's assets must
// exist (bus.Provision).
func New(ctx context.Context, nc *nats.Conn, cfg Config) (*Server, error) {
	cfg.Settings = cfg.Settings.WithDefaults()
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.DefaultAgent == "" {
		cfg.DefaultAgent = protocol.DefaultAgent
	}
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = files.DefaultMaxFileBytes
	}
	if err := cfg.Images.withDefaults(); err != nil {
		return nil, err
	}
	cfg.Metrics = metrics.Or(cfg.Metrics)
	if !protocol.ValidToken(cfg.DefaultAgent) {
		return nil, fmt.Errorf("gateway: default agent %q is not valid: use A-Z, a-z, 0-9, '_' and '-'", cfg.DefaultAgent)
	}
	auth, err := newAuthenticatorWith(cfg.APIKeys, cfg.JWT)
	if err != nil {
		return nil, err
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
	stores.Observe(cfg.Logger, cfg.Metrics)
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
	s := &Server{
		cfg:           cfg,
		names:         names,
		nc:            nc,
		js:            js,
		stores:        stores,
		pub:           pub,
		runs:          runs,
		events:        evs,
		log:           cfg.Logger,
		auth:          auth,
		keepAlive:     15 * time.Second,
		trailWait:     3 * time.Second,
		submitTimeout: 15 * time.Second,
		cancelTimeout: 30 * time.Second,
	}
	if s.assistants, err = kv.OpenAssistants(ctx, js, names); err != nil {
		cfg.Logger.Warn("assistants are unavailable", zap.Error(err))
		s.assistants = nil
	} else {
		s.assistants.Observe(cfg.Logger, cfg.Metrics)
	}
	if err := s.openStore(ctx); err != nil {
		cfg.Logger.Warn("the store is unavailable", zap.Error(err))
	}
	s.eraser, err = erase.New(ctx, erase.Config{NC: nc, JS: js, Names: names, Stores: stores, Files: cfg.Files, Logger: cfg.Logger, Metrics: cfg.Metrics})
	if err != nil {
		return nil, err
	}
	s.queue = &submit.Queue{JS: js, Names: names, Stores: stores, Events: pub, Submitter: "gateway"}
	if s.crons, err = crons.Open(ctx, js, names); err != nil {
		return nil, err
	}
	s.crons.Observe(cfg.Logger, cfg.Metrics)
	if cfg.Traces != nil {
		s.tracer = telemetry.Tracer(cfg.Traces)
	}
	s.routes()
	return s, nil
}

func (s *Server) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /healthz", s.healthz)
	m.HandleFunc("GET /readyz", s.readyz)
	m.HandleFunc("GET /info", s.info)
	if s.cfg.MetricsHandler != nil {
		m.Handle("GET /metrics", s.cfg.MetricsHandler)
	}

	m.HandleFunc("POST /threads", s.tenanted(s.createThread))
	m.HandleFunc("GET /threads", s.tenanted(s.listThreads))
	m.HandleFunc("POST /threads/search", s.tenanted(s.searchThreads))
	m.HandleFunc("POST /threads/count", s.tenanted(s.countThreads))
	m.HandleFunc("GET /threads/{thread_id}", s.tenanted(s.getThread))
	m.HandleFunc("DELETE /threads/{thread_id}", s.tenanted(s.deleteThread))
	m.HandleFunc("PATCH /threads/{thread_id}", s.tenanted(s.patchThread))
	m.HandleFunc("POST /threads/{thread_id}/copy", s.tenanted(s.copyThread))
	m.HandleFunc("GET /threads/{thread_id}/state", s.tenanted(s.threadState))
	m.HandleFunc("POST /threads/{thread_id}/state", s.tenanted(s.updateState))
	m.HandleFunc("GET /threads/{thread_id}/state/{checkpoint_id}", s.tenanted(s.stateAtCheckpoint))
	m.HandleFunc("POST /threads/{thread_id}/state/checkpoint", s.tenanted(s.stateAtCheckpointBody))
	m.HandleFunc("GET /threads/{thread_id}/history", s.tenanted(s.threadHistory))
	m.HandleFunc("POST /threads/{thread_id}/history", s.tenanted(s.threadHistory))
	m.HandleFunc("POST /threads/{thread_id}/compact", s.tenanted(s.compactThread))

	m.HandleFunc("GET /threads/{thread_id}/runs", s.tenanted(s.listRuns))
	m.HandleFunc(routeCreateRun, s.tenanted(s.createRun(modeBackground, false)))
	m.HandleFunc(routeCreateRunStream, s.tenanted(s.createRun(modeStream, false)))
	m.HandleFunc(routeCreateRunWait, s.tenanted(s.createRun(modeWait, false)))
	m.HandleFunc("GET /threads/{thread_id}/runs/{run_id}", s.tenanted(s.getRun))
	m.HandleFunc("GET /threads/{thread_id}/runs/{run_id}/stream", s.tenanted(s.joinStream))
	m.HandleFunc("GET /threads/{thread_id}/runs/{run_id}/join", s.tenanted(s.joinRun))
	m.HandleFunc("DELETE /threads/{thread_id}/runs/{run_id}", s.tenanted(s.deleteRun))
	m.HandleFunc("POST /threads/{thread_id}/runs/{run_id}/cancel", s.tenanted(s.cancelRun))
	m.HandleFunc("GET /threads/{thread_id}/runs/{run_id}/usage", s.tenanted(s.runUsage))
	m.HandleFunc("GET /threads/{thread_id}/usage", s.tenanted(s.threadUsage))

	m.HandleFunc(routeListFiles, s.tenanted(s.listFiles))
	m.HandleFunc(routeGetFile, s.tenanted(s.getFile))
	m.HandleFunc(routePutFile, s.tenanted(s.putFile))
	m.HandleFunc(routeUpload, s.tenanted(s.upload))

	m.HandleFunc("POST /assistants", s.tenanted(s.createAssistant))
	m.HandleFunc("POST /assistants/search", s.tenanted(s.searchAssistants))
	m.HandleFunc("POST /assistants/count", s.tenanted(s.countAssistants))
	m.HandleFunc("GET /assistants/{assistant_id}", s.tenanted(s.getAssistant))
	m.HandleFunc("PATCH /assistants/{assistant_id}", s.tenanted(s.patchAssistant))
	m.HandleFunc("DELETE /assistants/{assistant_id}", s.tenanted(s.deleteAssistant))
	m.HandleFunc("POST /assistants/{assistant_id}/versions", s.tenanted(s.assistantVersions))
	m.HandleFunc("POST /assistants/{assistant_id}/latest", s.tenanted(s.setLatestAssistant))
	m.HandleFunc("GET /assistants/{assistant_id}/schemas", s.tenanted(s.assistantSchemas))
	m.HandleFunc("GET /assistants/{assistant_id}/graph", s.tenanted(s.assistantGraph))
	m.HandleFunc("GET /assistants/{assistant_id}/subgraphs", s.tenanted(s.assistantSubgraphs))
	m.HandleFunc("GET /assistants/{assistant_id}/subgraphs/{namespace}", s.tenanted(s.assistantSubgraphs))

	m.HandleFunc("PUT /store/items", s.tenanted(s.putItem))
	m.HandleFunc("GET /store/items", s.tenanted(s.getItem))
	m.HandleFunc("DELETE /store/items", s.tenanted(s.deleteItem))
	m.HandleFunc("POST /store/items/search", s.tenanted(s.searchItems))
	m.HandleFunc("POST /store/namespaces", s.tenanted(s.listNamespaces))

	m.HandleFunc(routeStatelessRun, s.tenanted(s.createRun(modeBackground, true)))
	m.HandleFunc(routeStatelessRunStream, s.tenanted(s.createRun(modeStream, true)))
	m.HandleFunc("DELETE /users/{user_id}", s.tenanted(s.eraseUser))
	m.HandleFunc(routeStatelessRunWait, s.tenanted(s.createRun(modeWait, true)))
	m.HandleFunc("POST /runs/crons", s.tenanted(s.createCron(false)))
	m.HandleFunc("POST /threads/{thread_id}/runs/crons", s.tenanted(s.createCron(true)))
	m.HandleFunc("POST /runs/crons/search", s.tenanted(s.searchCrons))
	m.HandleFunc("POST /runs/crons/count", s.tenanted(s.countCrons))
	m.HandleFunc("GET /runs/crons/{cron_id}", s.tenanted(s.getCron))
	m.HandleFunc("PATCH /runs/crons/{cron_id}", s.tenanted(s.patchCron))
	m.HandleFunc("DELETE /runs/crons/{cron_id}", s.tenanted(s.deleteCron))

	s.consoleRoutes(m) // console.go
	s.mux = m
}

// Handler returns the HTTP handler of the API. Every request body is
// bounded by MaxBodyBytes (uploads by MaxFileBytes), and unknown routes
// answer the JSON error body.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		h, pattern := s.mux.Handler(r)
		r, done := s.observe(r, pattern)
		defer func() { done(sw.code()) }()
		r.Body = http.MaxBytesReader(sw, r.Body, s.bodyLimit(pattern))
		r, authorized := s.authenticate(sw, r, pattern)
		switch {
		case !authorized:
		case pattern == "":
			s.noRoute(sw, r, h)
		default:
			s.mux.ServeHTTP(sw, r)
		}
		s.log.Debug("http request",
			zap.String("method", r.Method), zap.String("path", r.URL.Path),
			zap.Int("status", sw.code()), zap.Duration("duration", time.Since(start)))
	})
}

// noRoute answers what the mux would answer (404, or 405 with Allow) in
// the API's error format.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request, h http.Handler) {
	probe := &headerRecorder{header: make(http.Header)}
	h.ServeHTTP(probe, r)
	if probe.status == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", probe.header.Get("Allow"))
		writeError(w, &apiError{status: http.StatusMethodNotAllowed, code: protocol.CodeInvalid,
			msg: fmt.Sprintf("%s is not allowed on %s", r.Method, r.URL.Path)})
		return
	}
	writeError(w, errNotFound(fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)))
}

// tenantHandler is a handler of tenant-scoped routes. An error it returns
// is written as the API's error body; a handler that already started its
// response (SSE) reports nothing.
type tenantHandler func(w http.ResponseWriter, r *http.Request, tenant string) error

func (s *Server) tenanted(h tenantHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tenant, err := tenantOf(r)
		if err == nil {
			err = s.checkOwner(r, tenant)
		}
		if err == nil {
			err = h(w, r, tenant)
		}
		if err == nil {
			return
		}
		ae := classify(err)
		if ae.status >= 500 {
			fields := []zap.Field{zap.String("method", r.Method), zap.String("path", r.URL.Path),
				zap.String("tenant", tenant), zap.String("thread_id", r.PathValue("thread_id")),
				zap.String("run_id", r.PathValue("run_id")), zap.Int("status", ae.status), zap.Error(err)}
			if ae.store != "" {
				s.cfg.Metrics.StoreFull(ae.store)
				fields = append(fields, zap.String("store", ae.store))
			}
			s.log.Error("request failed", fields...)
		}
		writeError(w, ae)
	}
}

// tenantOf returns the tenant a request acts for: its API key's when the
// gateway has keys, else the X-Tenant header (default "default").
func tenantOf(r *http.Request) (string, error) {
	if t, ok, err := credentialTenant(r); ok {
		return t, err
	}
	t := r.Header.Get("X-Tenant")
	if t == "" {
		return protocol.DefaultTenant, nil
	}
	if err := protocol.CheckToken("X-Tenant", t); err != nil {
		return "", err
	}
	return t, nil
}

// pathToken returns a path id after checking it may become a subject token
// or a key.
func pathToken(r *http.Request, name string) (string, error) {
	v := r.PathValue(name)
	if err := protocol.CheckToken(name, v); err != nil {
		return "", err
	}
	return v, nil
}

// newID returns a random id valid as a token: 26 characters of base32,
// lower-cased.
func newID() string { return strings.ToLower(rand.Text()) }

// runLocation is the Content-Location of a run.
func runLocation(thread, run string) string { return "/threads/" + thread + "/runs/" + run }

// statusWriter remembers the status for the request log. Unwrap lets
// http.ResponseController reach Flush on the real writer.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) code() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

// headerRecorder captures what the mux's own 404/405 handlers answer.
type headerRecorder struct {
	header http.Header
	status int
}

func (h *headerRecorder) Header() http.Header { return h.header }
func (h *headerRecorder) WriteHeader(code int) {
	if h.status == 0 {
		h.status = code
	}
}
func (h *headerRecorder) Write(b []byte) (int, error) {
	if h.status == 0 {
		h.status = http.StatusOK
	}
	return len(b), nil
}
