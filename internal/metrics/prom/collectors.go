package prom

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/natsagent/natsagent/internal/metrics"
)

// workerCollector reports the gauges of the process's workers, summed
// (gateway --dev runs several in one process), read at collection time so
// the run path never updates a gauge.
type workerCollector struct {
	trackers[metrics.WorkerStats]
}

// trackers is the set of stats functions a collector sums, each added by
// track and removed by the function track returns.
type trackers[T any] struct {
	mu  sync.Mutex
	fns map[*func() T]struct{}
}

func (c *trackers[T]) track(stats func() T) func() {
	key := &stats
	c.mu.Lock()
	if c.fns == nil {
		c.fns = map[*func() T]struct{}{}
	}
	c.fns[key] = struct{}{}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.fns, key)
		c.mu.Unlock()
	}
}

// read calls every tracked function, outside the lock.
func (c *trackers[T]) read() []T {
	c.mu.Lock()
	fns := make([]func() T, 0, len(c.fns))
	for f := range c.fns {
		fns = append(fns, *f)
	}
	c.mu.Unlock()
	out := make([]T, len(fns))
	for i, f := range fns {
		out[i] = f()
	}
	return out
}

var (
	descSlots   = prometheus.NewDesc(Namespace+"_worker_slots", "Runs the process's workers may execute at once (their concurrency).", nil, nil)
	descBusy    = prometheus.NewDesc(Namespace+"_worker_slots_busy", "Slots held by runs being decided or executed (runs waiting for their thread hold none).", nil, nil)
	descLeases  = prometheus.NewDesc(Namespace+"_worker_active_leases", "Runs in progress on the process's workers, each holding its thread's lease.", nil, nil)
	descWaiting = prometheus.NewDesc(Namespace+"_worker_waiting_runs", "Runs held by the process's workers while another run of their thread goes first.", nil, nil)
	descLag     = prometheus.NewDesc(Namespace+"_consumer_lag", "Run requests not yet finished by any worker: num_pending + num_ack_pending of the runs consumer, read at most every refresh interval (15s).", []string{"consumer"}, nil)
	descLagAge  = prometheus.NewDesc(Namespace+"_consumer_lag_age_seconds", "Age of the consumer lag reported.", []string{"consumer"}, nil)
)

func (c *workerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descSlots
	ch <- descBusy
	ch <- descLeases
	ch <- descWaiting
}

func (c *workerCollector) Collect(ch chan<- prometheus.Metric) {
	var sum metrics.WorkerStats
	for _, s := range c.read() {
		sum.Slots += s.Slots
		sum.BusySlots += s.BusySlots
		sum.ActiveLeases += s.ActiveLeases
		sum.WaitingRuns += s.WaitingRuns
	}
	ch <- prometheus.MustNewConstMetric(descSlots, prometheus.GaugeValue, float64(sum.Slots))
	ch <- prometheus.MustNewConstMetric(descBusy, prometheus.GaugeValue, float64(sum.BusySlots))
	ch <- prometheus.MustNewConstMetric(descLeases, prometheus.GaugeValue, float64(sum.ActiveLeases))
	ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(sum.WaitingRuns))
}

// lagCollector reports the runs consumer's lag. It is read from the
// server lazily, when a scrape finds the last reading older than refresh,
// by one of the workers tracking the consumer: a process never asks the
// server more than once per interval, and not at all when nobody scrapes.
type lagCollector struct {
	refresh time.Duration
	mu      sync.Mutex
	sources map[string]*lagSource
}

type lagSource struct {
	readers map[*func(context.Context) (uint64, error)]struct{}
	value   uint64
	read    time.Time // zero: never read
}

// lagReadTimeout bounds one consumer info request during a scrape.
const lagReadTimeout = 2 * time.Second

func (c *lagCollector) track(key string, lag func(context.Context) (uint64, error)) func() {
	f := &lag
	c.mu.Lock()
	s := c.sources[key]
	if s == nil {
		s = &lagSource{readers: map[*func(context.Context) (uint64, error)]struct{}{}}
		c.sources[key] = s
	}
	s.readers[f] = struct{}{}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(s.readers, f)
		if len(s.readers) == 0 && c.sources[key] == s {
			delete(c.sources, key)
		}
		c.mu.Unlock()
	}
}

func (c *lagCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLag
	ch <- descLagAge
}

// Collect holds the mutex across the reads: concurrent scrapes wait for one
// reading instead of each asking the server.
func (c *lagCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	for key, s := range c.sources {
		if s.read.IsZero() || now.Sub(s.read) >= c.refresh {
			for f := range s.readers {
				ctx, cancel := context.WithTimeout(context.Background(), lagReadTimeout)
				v, err := (*f)(ctx)
				cancel()
				if err == nil {
					s.value, s.read = v, time.Now()
					break
				}
			}
		}
		if s.read.IsZero() {
			continue // never read: no figure is better than a made-up zero
		}
		ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, float64(s.value), key)
		ch <- prometheus.MustNewConstMetric(descLagAge, prometheus.GaugeValue, time.Since(s.read).Seconds(), key)
	}
}

// storeIndexCollector reports the gateway's store search index, summed
// over the indexes tracked (one a gateway), read at collection time.
type storeIndexCollector struct {
	trackers[metrics.StoreIndexStats]
}

var (
	descIndexBytes     = prometheus.NewDesc(Namespace+"_store_index_bytes", "Memory the store's search index holds (an estimate: values decoded, vectors unpacked).", nil, nil)
	descIndexBudget    = prometheus.NewDesc(Namespace+"_store_index_budget_bytes", "The store search index's memory budget (store.index_memory_bytes).", nil, nil)
	descIndexTenants   = prometheus.NewDesc(Namespace+"_store_index_tenants", "Tenants whose store items the search index holds.", nil, nil)
	descIndexLoads     = prometheus.NewDesc(Namespace+"_store_index_loads_total", "Tenants read from the store bucket into the search index (a first search, or one after an eviction).", nil, nil)
	descIndexEvictions = prometheus.NewDesc(Namespace+"_store_index_evictions_total", "Tenants the search index dropped, least recently searched first, to stay within its budget.", nil, nil)
	descIndexOversized = prometheus.NewDesc(Namespace+"_store_index_oversized_total", "Times a tenant was found larger than the whole index budget (its searches then read the bucket).", nil, nil)
	descIndexMissed    = prometheus.NewDesc(Namespace+"_store_index_missed_removals_total", "Tenants the search index dropped, to read them from the bucket again, because another process's removal reached it only through the bucket (its core NATS notice was missed).", nil, nil)
	descIndexBucket    = prometheus.NewDesc(Namespace+"_store_index_bucket_searches_total", "Store searches and namespace listings of tenants larger than the budget, answered by reading the bucket.", nil, nil)
)

func (c *storeIndexCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descIndexBytes, descIndexBudget, descIndexTenants, descIndexLoads, descIndexEvictions, descIndexOversized, descIndexBucket, descIndexMissed} {
		ch <- d
	}
}

func (c *storeIndexCollector) Collect(ch chan<- prometheus.Metric) {
	stats := c.read()
	if len(stats) == 0 {
		return // no gateway in this process: no figures
	}
	var sum metrics.StoreIndexStats
	for _, s := range stats {
		sum.Bytes += s.Bytes
		sum.Budget += s.Budget
		sum.Tenants += s.Tenants
		sum.Loads += s.Loads
		sum.Evictions += s.Evictions
		sum.Oversized += s.Oversized
		sum.BucketSearches += s.BucketSearches
		sum.MissedRemovals += s.MissedRemovals
	}
	ch <- prometheus.MustNewConstMetric(descIndexBytes, prometheus.GaugeValue, float64(sum.Bytes))
	ch <- prometheus.MustNewConstMetric(descIndexBudget, prometheus.GaugeValue, float64(sum.Budget))
	ch <- prometheus.MustNewConstMetric(descIndexTenants, prometheus.GaugeValue, float64(sum.Tenants))
	ch <- prometheus.MustNewConstMetric(descIndexLoads, prometheus.CounterValue, float64(sum.Loads))
	ch <- prometheus.MustNewConstMetric(descIndexEvictions, prometheus.CounterValue, float64(sum.Evictions))
	ch <- prometheus.MustNewConstMetric(descIndexOversized, prometheus.CounterValue, float64(sum.Oversized))
	ch <- prometheus.MustNewConstMetric(descIndexBucket, prometheus.CounterValue, float64(sum.BucketSearches))
	ch <- prometheus.MustNewConstMetric(descIndexMissed, prometheus.CounterValue, float64(sum.MissedRemovals))
}
