// Package metrics owns what natsagent measures for operators: the Recorder
// the worker, the agent loop, the middlewares and the gateway report
// events to, and its no-op default. It names no metric backend: the
// Prometheus implementation lives in metrics/prom, so the packages that
// report never import a client library and tests inject their own
// registry. Labels are low-cardinality by contract: agent, model, status,
// kind, purpose, route; never a run, thread or tenant id (a tenant label
// exists only where the implementation is configured to add it).
package metrics

import (
	"context"
	"time"

	"github.com/natsagent/natsagent/internal/protocol"
)

// Recorder receives measurements. Implementations are safe for concurrent
// use and cheap: methods are called on the run path, a few times per model
// call at most.
type Recorder interface {
	// RunStarted is called when a run's first attempt starts, with its
	// strategy and how long its request waited in the queue.
	RunStarted(agent, strategy string, queueWait time.Duration)
	// RunFinished is called once per run when a worker records its
	// terminal status; ran is how long its last attempt ran (negative when
	// it never started: rejected, cancelled while pending, invalid).
	RunFinished(tenant, agent, status string, ran time.Duration)
	// ModelCall is one provider call of a run (each retry is one), with
	// its outcome (ok, error, cancelled).
	ModelCall(model, outcome string, d time.Duration)
	// Tokens adds one model call's tokens, by purpose (main, summary).
	Tokens(tenant, model, purpose string, input, output int)
	// ModelRetry counts a retried model call by kind (network, error,
	// fallback).
	ModelRetry(kind string)
	// CancelRequest counts a cancel request a worker answered, by outcome
	// (ok or the error code).
	CancelRequest(outcome string)
	// DeadLettered counts a run request copied to the dead-letter stream,
	// by reason (invalid, conflict, max_deliveries).
	DeadLettered(reason string)
	// StoreFull counts a write JetStream refused for lack of room, by the
	// stream or bucket it went to.
	StoreFull(store string)
	// RecordUndecodable counts a stored record a listing or search skipped
	// because it does not decode (corrupted, or written by a newer
	// version), by the bucket it is in.
	RecordUndecodable(bucket string)
	// JobProcessed counts a run request a worker took to its end, and
	// whether it was a redelivery.
	JobProcessed(redelivered bool)
	// ToolCall is one tool call of a run, by tool name (the run's own
	// tools; anything else is "unknown"), with its result status (success,
	// error; cancelled or failed when it ended without a result) and how
	// long it took.
	ToolCall(tool, status string, d time.Duration)
	// FencePause counts a run paused because its lease's renewal was
	// late; FenceStop a run its lease fence stopped, by reason
	// (FenceLeaseTaken, FenceLeaseExpired).
	FencePause()
	FenceStop(reason string)
	// TrackWorker adds a worker's gauges, read when metrics are collected,
	// until untrack is called.
	TrackWorker(stats func() WorkerStats) (untrack func())
	// TrackConsumer adds the lag of the runs consumer named key (stream and
	// consumer), read at most once per refresh interval however many
	// workers of the process track it, until untrack is called.
	TrackConsumer(key string, lag func(ctx context.Context) (uint64, error)) (untrack func())

	// TrackStoreIndex adds the gauges and counts of a gateway's store
	// search index, read when metrics are collected, until untrack is
	// called.
	TrackStoreIndex(stats func() StoreIndexStats) (untrack func())

	// HTTPRequest is one gateway request, by route pattern and status code.
	HTTPRequest(route string, code int, d time.Duration)
	// RunSubmitted counts a run the gateway published, by strategy.
	RunSubmitted(strategy string)
}

// WorkerStats is a worker's state when metrics are collected.
type WorkerStats struct {
	// Slots is the worker's concurrency; BusySlots are held by runs
	// (running or deciding), not by runs waiting for their thread.
	Slots, BusySlots int
	// ActiveLeases are the runs in progress, each holding its thread.
	ActiveLeases int
	// WaitingRuns wait for their thread to be free.
	WaitingRuns int
}

// StoreIndexStats is a store search index's state when metrics are
// collected: the memory it holds (an estimate) and its budget, the
// tenants it holds, and counts since it started.
type StoreIndexStats struct {
	Bytes, Budget int64
	Tenants       int
	// Loads are tenants read into the index, Evictions tenants dropped to
	// stay within the budget, Oversized tenants found larger than the
	// budget, BucketSearches searches of those, read from the bucket.
	Loads, Evictions, Oversized, BucketSearches uint64
	// MissedRemovals are tenants dropped because a removal's notice was
	// missed (it came through the bucket only).
	MissedRemovals uint64
}

// Model call outcomes.
const (
	OutcomeOK        = "ok"
	OutcomeError     = "error"
	OutcomeCancelled = "cancelled"
)

// Dead-letter reasons.
const (
	DLQInvalid       = "invalid"
	DLQConflict      = "conflict"
	DLQMaxDeliveries = "max_deliveries"
)

// Fence stop reasons.
const (
	// FenceLeaseTaken: a write of the lease was refused because the
	// thread's lease is another run's or has a newer epoch.
	FenceLeaseTaken = "lease_taken"
	// FenceLeaseExpired: no write of the lease was confirmed for twice
	// the lapse a redelivery waits for (the server out of reach).
	FenceLeaseExpired = "lease_expired"
)

// Nop records nothing: the default of every Config.
type Nop struct{}

var _ Recorder = Nop{}

func (Nop) RunStarted(string, string, time.Duration)          {}
func (Nop) RunFinished(string, string, string, time.Duration) {}
func (Nop) ModelCall(string, string, time.Duration)           {}
func (Nop) Tokens(string, string, string, int, int)           {}
func (Nop) ModelRetry(string)                                 {}
func (Nop) CancelRequest(string)                              {}
func (Nop) DeadLettered(string)                               {}
func (Nop) StoreFull(string)                                  {}
func (Nop) RecordUndecodable(string)                          {}
func (Nop) JobProcessed(bool)                                 {}
func (Nop) ToolCall(string, string, time.Duration)            {}
func (Nop) FencePause()                                       {}
func (Nop) FenceStop(string)                                  {}
func (Nop) TrackWorker(func() WorkerStats) func()             { return func() {} }
func (Nop) TrackConsumer(string, func(context.Context) (uint64, error)) func() {
	return func() {}
}
func (Nop) TrackStoreIndex(func() StoreIndexStats) func() { return func() {} }
func (Nop) HTTPRequest(string, int, time.Duration)        {}
func (Nop) RunSubmitted(string)                           {}

// Or returns r, or Nop when r is nil.
func Or(r Recorder) Recorder {
	if r == nil {
		return Nop{}
	}
	return r
}

// StrategyLabel is a run's multitask strategy as a label value: the
// protocol's four (empty is enqueue, the default), anything else "other",
// so a request cannot add series.
func StrategyLabel(s string) string {
	switch s {
	case "":
		return protocol.StrategyEnqueue
	case protocol.StrategyEnqueue, protocol.StrategyReject, protocol.StrategySteer, protocol.StrategyRollback:
		return s
	}
	return "other"
}
