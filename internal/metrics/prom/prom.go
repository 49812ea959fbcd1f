// Package prom implements metrics.Recorder with the Prometheus client and
// serves the text exposition at /metrics. It owns the metric names, types,
// labels and buckets (docs/operations.md, "Observability"), and nothing
// else: the packages that report events see only metrics.Recorder.
//
// The run path stays cheap: each labelled series is resolved once and kept
// in a copy-on-write map read with one atomic load, so recording is a map
// lookup and Prometheus' own atomic add, without a lock or an allocation.
// Label values that come from outside (model and tenant names) are capped
// per label: beyond MaxLabelValues distinct values, new ones are recorded
// as "other", so a client sending random model names cannot grow the
// registry without bound.
package prom

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/natsagent/natsagent/internal/metrics"
)

// Namespace prefixes every metric name.
const Namespace = "natsagent"

// Other replaces a label value beyond the cap.
const Other = "other"

// Options configure a Recorder. Zero values take defaults.
type Options struct {
	// Registry receives the metrics; nil creates one with the Go runtime
	// and process collectors.
	Registry *prometheus.Registry
	// TenantLabel adds a tenant label to runs_finished_total and
	// model_tokens_total. Off by default: tenants are unbounded and, on a
	// shared /metrics, visible to whoever scrapes.
	TenantLabel bool
	// MaxLabelValues caps the distinct values of the model and tenant
	// labels (default 200).
	MaxLabelValues int
	// LagRefresh is how old the consumer lag may be before a scrape reads
	// it again (default 15s; negative reads it at every scrape).
	LagRefresh time.Duration
}

// Recorder is a metrics.Recorder backed by Prometheus.
type Recorder struct {
	reg     *prometheus.Registry
	tenant  bool
	models  *capped
	tenants *capped
	tools   *capped

	runsStarted  *series[[2]string, prometheus.Counter]
	queueWait    *series[string, prometheus.Observer]
	runsFinished *series[[3]string, prometheus.Counter]
	runDuration  *series[[2]string, prometheus.Observer]
	modelCalls   *series[[2]string, prometheus.Observer]
	tokens       *series[[3]string, tokenPair]
	retries      *series[string, prometheus.Counter]
	cancels      *series[string, prometheus.Counter]
	dlq          *series[string, prometheus.Counter]
	storeFull    *series[string, prometheus.Counter]
	undecodable  *series[string, prometheus.Counter]
	jobs         [2]prometheus.Counter
	toolCalls    *series[[2]string, prometheus.Observer]
	fencePauses  prometheus.Counter
	fenceStops   *series[string, prometheus.Counter]
	httpCount    *series[[2]string, prometheus.Counter]
	httpDuration *series[string, prometheus.Observer]
	submitted    *series[string, prometheus.Counter]

	workers    *workerCollector
	lag        *lagCollector
	storeIndex *storeIndexCollector
}

var _ metrics.Recorder = (*Recorder)(nil)

type tokenPair struct{ in, out prometheus.Counter }

// Buckets, in seconds.
var (
	runBuckets   = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}
	waitBuckets  = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600}
	modelBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600}
	toolBuckets  = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
	httpBuckets  = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
)

// New registers natsagent's metrics.
func New(o Options) (*Recorder, error) {
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		if err := reg.Register(collectors.NewGoCollector()); err != nil {
			return nil, err
		}
		if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
			return nil, err
		}
	}
	if o.MaxLabelValues <= 0 {
		o.MaxLabelValues = 200
	}
	if o.LagRefresh == 0 {
		o.LagRefresh = 15 * time.Second
	}
	r := &Recorder{reg: reg, tenant: o.TenantLabel, models: newCapped(o.MaxLabelValues), tenants: newCapped(o.MaxLabelValues), tools: newCapped(o.MaxLabelValues)}
	withTenant := func(labels ...string) []string {
		if o.TenantLabel {
			return append([]string{"tenant"}, labels...)
		}
		return labels
	}

	started := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "runs_started_total",
		Help: "Runs whose first attempt started, by agent and multitask strategy (steer and rollback runs included)."}, []string{"agent", "strategy"})
	wait := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "run_queue_wait_seconds",
		Help: "Time from a run's creation (its record's created_at, else its request's enqueue time) to its first start.", Buckets: waitBuckets}, []string{"agent"})
	finished := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "runs_finished_total",
		Help: "Runs that reached a terminal status, by agent and status."}, withTenant("agent", "status"))
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "run_duration_seconds",
		Help: "Time from a run's (last) start to its end, by agent and terminal status.", Buckets: runBuckets}, []string{"agent", "status"})
	calls := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "model_call_duration_seconds",
		Help: "Latency of each provider call of a run (a retried call counts each attempt), by model and outcome.", Buckets: modelBuckets}, []string{"model", "outcome"})
	tokens := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "model_tokens_total",
		Help: "Tokens of model calls, by model, purpose (main, summary) and direction (input, output)."}, withTenant("model", "purpose", "direction"))
	retries := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "model_retries_total",
		Help: "Model calls retried, by kind (network, error, fallback)."}, []string{"kind"})
	cancels := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "cancel_requests_total",
		Help: "Cancel requests answered by workers, by outcome (ok, or the error code)."}, []string{"outcome"})
	dlq := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "dead_lettered_total",
		Help: "Run requests copied to the dead-letter stream, by reason (invalid, conflict, max_deliveries)."}, []string{"reason"})
	storeFull := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "store_full_total",
		Help: "Writes JetStream refused for lack of room (a full server or account store, or a stream or bucket at its max bytes), by the stream or bucket written to."}, []string{"store"})
	undecodable := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "records_undecodable_total",
		Help: "Stored records a listing or search skipped because they do not decode (corrupted, or written by a newer version), by bucket; each skip counts."}, []string{"bucket"})
	jobs := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "worker_jobs_processed_total",
		Help: "Run requests a worker took to their end (finished, handed back or dropped), by delivery (first, redelivery)."}, []string{"delivery"})
	toolCalls := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "tool_call_duration_seconds",
		Help: "Latency of each tool call of a run, by tool and result status (success, error; cancelled or failed when the call ended without a result).", Buckets: toolBuckets}, []string{"tool", "status"})
	fencePauses := prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "lease_fence_pauses_total",
		Help: "Runs paused because the renewal of their thread lease was not confirmed in time."})
	fenceStops := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "lease_fence_stops_total",
		Help: "Runs their lease fence stopped, by reason (lease_taken: the lease is another run's or newer; lease_expired: no renewal confirmed for twice the ack wait)."}, []string{"reason"})
	httpCount := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "http_requests_total",
		Help: "Gateway HTTP requests, by route pattern and status code."}, []string{"route", "code"})
	httpDuration := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "http_request_duration_seconds",
		Help: "Gateway HTTP request latency by route pattern (a stream lasts as long as its run).", Buckets: httpBuckets}, []string{"route"})
	submitted := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "gateway_runs_submitted_total",
		Help: "Runs the gateway published, by multitask strategy."}, []string{"strategy"})
	r.workers = &workerCollector{}
	r.lag = &lagCollector{refresh: o.LagRefresh, sources: map[string]*lagSource{}}
	r.storeIndex = &storeIndexCollector{}
	// A registry that already holds natsagent's metrics (a gateway --dev
	// and its in-process workers share the process's registry) gives its
	// collectors: both recorders then count into the same series, and the
	// worker gauges sum over every tracked worker.
	if err := errors.Join(register(reg, &started), register(reg, &wait), register(reg, &finished), register(reg, &duration),
		register(reg, &calls), register(reg, &tokens), register(reg, &retries), register(reg, &cancels), register(reg, &dlq),
		register(reg, &storeFull), register(reg, &undecodable), register(reg, &jobs), register(reg, &toolCalls), register(reg, &fencePauses),
		register(reg, &fenceStops), register(reg, &httpCount), register(reg, &httpDuration), register(reg, &submitted),
		register(reg, &r.workers), register(reg, &r.lag), register(reg, &r.storeIndex)); err != nil {
		return nil, err
	}

	r.runsStarted = newSeries(func(k [2]string) prometheus.Counter { return started.WithLabelValues(k[0], k[1]) })
	r.queueWait = newSeries(func(k string) prometheus.Observer { return wait.WithLabelValues(k) })
	r.runsFinished = newSeries(func(k [3]string) prometheus.Counter {
		if o.TenantLabel {
			return finished.WithLabelValues(k[0], k[1], k[2])
		}
		return finished.WithLabelValues(k[1], k[2])
	})
	r.runDuration = newSeries(func(k [2]string) prometheus.Observer { return duration.WithLabelValues(k[0], k[1]) })
	r.modelCalls = newSeries(func(k [2]string) prometheus.Observer { return calls.WithLabelValues(k[0], k[1]) })
	r.tokens = newSeries(func(k [3]string) tokenPair {
		if o.TenantLabel {
			return tokenPair{tokens.WithLabelValues(k[0], k[1], k[2], "input"), tokens.WithLabelValues(k[0], k[1], k[2], "output")}
		}
		return tokenPair{tokens.WithLabelValues(k[1], k[2], "input"), tokens.WithLabelValues(k[1], k[2], "output")}
	})
	r.retries = newSeries(func(k string) prometheus.Counter { return retries.WithLabelValues(k) })
	r.cancels = newSeries(func(k string) prometheus.Counter { return cancels.WithLabelValues(k) })
	r.dlq = newSeries(func(k string) prometheus.Counter { return dlq.WithLabelValues(k) })
	r.storeFull = newSeries(func(k string) prometheus.Counter { return storeFull.WithLabelValues(k) })
	r.undecodable = newSeries(func(k string) prometheus.Counter { return undecodable.WithLabelValues(k) })
	r.jobs = [2]prometheus.Counter{jobs.WithLabelValues("first"), jobs.WithLabelValues("redelivery")}
	r.toolCalls = newSeries(func(k [2]string) prometheus.Observer { return toolCalls.WithLabelValues(k[0], k[1]) })
	r.fencePauses = fencePauses
	r.fenceStops = newSeries(func(k string) prometheus.Counter { return fenceStops.WithLabelValues(k) })
	r.httpCount = newSeries(func(k [2]string) prometheus.Counter { return httpCount.WithLabelValues(k[0], k[1]) })
	r.httpDuration = newSeries(func(k string) prometheus.Observer { return httpDuration.WithLabelValues(k) })
	r.submitted = newSeries(func(k string) prometheus.Counter { return submitted.WithLabelValues(k) })
	return r, nil
}

// register registers *c on reg, or, when reg already holds an equal
// collector, points *c at that one. A collector of the same name but
// other labels (another TenantLabel) is an error.
func register[C prometheus.Collector](reg *prometheus.Registry, c *C) error {
	err := reg.Register(*c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			*c = existing
			return nil
		}
	}
	return err
}

// Registry returns the registry the metrics are in.
func (r *Recorder) Registry() *prometheus.Registry { return r.reg }

// Handler serves the registry in the Prometheus text (or OpenMetrics)
// format.
func (r *Recorder) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg})
}

func (r *Recorder) tenantOf(t string) string {
	if !r.tenant {
		return ""
	}
	return r.tenants.value(t)
}

// RunStarted implements metrics.Recorder.
func (r *Recorder) RunStarted(agent, strategy string, queueWait time.Duration) {
	r.runsStarted.get([2]string{agent, strategy}).Inc()
	r.queueWait.get(agent).Observe(max(queueWait, 0).Seconds())
}

// RunFinished implements metrics.Recorder.
func (r *Recorder) RunFinished(tenant, agent, status string, ran time.Duration) {
	r.runsFinished.get([3]string{r.tenantOf(tenant), agent, status}).Inc()
	if ran >= 0 {
		r.runDuration.get([2]string{agent, status}).Observe(ran.Seconds())
	}
}

// ModelCall implements metrics.Recorder.
func (r *Recorder) ModelCall(model, outcome string, d time.Duration) {
	r.modelCalls.get([2]string{r.models.value(model), outcome}).Observe(d.Seconds())
}

// Tokens implements metrics.Recorder.
func (r *Recorder) Tokens(tenant, model, purpose string, input, output int) {
	p := r.tokens.get([3]string{r.tenantOf(tenant), r.models.value(model), purpose})
	if input > 0 {
		p.in.Add(float64(input))
	}
	if output > 0 {
		p.out.Add(float64(output))
	}
}

// ModelRetry implements metrics.Recorder.
func (r *Recorder) ModelRetry(kind string) { r.retries.get(kind).Inc() }

// CancelRequest implements metrics.Recorder.
func (r *Recorder) CancelRequest(outcome string) { r.cancels.get(outcome).Inc() }

// DeadLettered implements metrics.Recorder.
func (r *Recorder) DeadLettered(reason string) { r.dlq.get(reason).Inc() }

// StoreFull implements metrics.Recorder.
func (r *Recorder) StoreFull(store string) { r.storeFull.get(store).Inc() }

// RecordUndecodable implements metrics.Recorder.
func (r *Recorder) RecordUndecodable(bucket string) { r.undecodable.get(bucket).Inc() }

// JobProcessed implements metrics.Recorder.
func (r *Recorder) JobProcessed(redelivered bool) {
	if redelivered {
		r.jobs[1].Inc()
		return
	}
	r.jobs[0].Inc()
}

// ToolCall implements metrics.Recorder.
func (r *Recorder) ToolCall(tool, status string, d time.Duration) {
	r.toolCalls.get([2]string{r.tools.value(tool), status}).Observe(d.Seconds())
}

// FencePause implements metrics.Recorder.
func (r *Recorder) FencePause() { r.fencePauses.Inc() }

// FenceStop implements metrics.Recorder.
func (r *Recorder) FenceStop(reason string) { r.fenceStops.get(reason).Inc() }

// HTTPRequest implements metrics.Recorder.
func (r *Recorder) HTTPRequest(route string, code int, d time.Duration) {
	r.httpCount.get([2]string{route, strconv.Itoa(code)}).Inc()
	r.httpDuration.get(route).Observe(d.Seconds())
}

// RunSubmitted implements metrics.Recorder.
func (r *Recorder) RunSubmitted(strategy string) { r.submitted.get(strategy).Inc() }

// TrackWorker implements metrics.Recorder.
func (r *Recorder) TrackWorker(stats func() metrics.WorkerStats) func() {
	return r.workers.track(stats)
}

// TrackStoreIndex implements metrics.Recorder.
func (r *Recorder) TrackStoreIndex(stats func() metrics.StoreIndexStats) func() {
	return r.storeIndex.track(stats)
}

// TrackConsumer implements metrics.Recorder.
func (r *Recorder) TrackConsumer(key string, lag func(ctx context.Context) (uint64, error)) func() {
	return r.lag.track(key, lag)
}

// series resolves a labelled metric once per label set. Reads are one
// atomic load and a map lookup; a new label set copies the map under a
// mutex, which happens a handful of times in a process's life.
type series[K comparable, V any] struct {
	m  atomic.Pointer[map[K]V]
	mu sync.Mutex
	mk func(K) V
}

func newSeries[K comparable, V any](mk func(K) V) *series[K, V] {
	s := &series[K, V]{mk: mk}
	s.m.Store(&map[K]V{})
	return s
}

func (s *series[K, V]) get(k K) V {
	if v, ok := (*s.m.Load())[k]; ok {
		return v
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.m.Load()
	if v, ok := old[k]; ok {
		return v
	}
	next := make(map[K]V, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	v := s.mk(k)
	next[k] = v
	s.m.Store(&next)
	return v
}

// capped admits up to max distinct label values; later ones read as Other
// and are not remembered, so the set stays bounded too.
type capped struct {
	m   atomic.Pointer[map[string]struct{}]
	mu  sync.Mutex
	max int
}

func newCapped(max int) *capped {
	c := &capped{max: max}
	c.m.Store(&map[string]struct{}{})
	return c
}

func (c *capped) value(v string) string {
	if _, ok := (*c.m.Load())[v]; ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := *c.m.Load()
	if _, ok := old[v]; ok {
		return v
	}
	if len(old) >= c.max {
		return Other
	}
	next := make(map[string]struct{}, len(old)+1)
	for k := range old {
		next[k] = struct{}{}
	}
	next[v] = struct{}{}
	c.m.Store(&next)
	return v
}
