package bus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Settings are the JetStream settings of a deployment. Zero values take the
// defaults below; every process of a deployment must use the same values,
// because provisioning refuses to change an existing asset.
type Settings struct {
	Names    Names
	Replicas int
	// EventsMaxAge is how long run events are retained (default 24h).
	EventsMaxAge time.Duration
	// DuplicateWindow is how long a run id published twice is recognised
	// as the same run by the runs stream (default 10m). After it, the run
	// record still refuses to run a finished run again.
	DuplicateWindow time.Duration
	// AckWait is how long a worker may go silent before its run is handed
	// to another worker (default 30s). Workers heartbeat every AckWait/3.
	AckWait time.Duration
	// MaxDeliver bounds how many times one run request is delivered before
	// it is dead-lettered (default 10).
	MaxDeliver int
	// MaxAckPending bounds runs held (running or waiting for their
	// thread) across all workers (default 20,000).
	MaxAckPending int
	// MaxRequestBytes bounds a run request (default 256 KiB). Workers end
	// a larger request as an error run and dead-letter it; the server's
	// max_payload (1 MiB by default) bounds what reaches the stream at all.
	MaxRequestBytes int
	// DLQMaxBytes bounds the dead-letter stream (default 1 GiB); when it
	// is full the oldest dead letters are dropped, so one tenant sending
	// bad requests cannot fill the store of every tenant.
	DLQMaxBytes int64
	// DLQMaxAge is how long dead letters are kept (default 7 days).
	DLQMaxAge time.Duration
	// Storage is file (default) or memory.
	Storage jetstream.StorageType
}

// Defaults used for zero Settings fields.
const (
	DefaultEventsMaxAge    = 24 * time.Hour
	DefaultDuplicateWindow = 10 * time.Minute
	DefaultAckWait         = 30 * time.Second
	DefaultMaxDeliver      = 10
	DefaultMaxAckPending   = 20000
	DefaultMaxRequestBytes = 256 << 10
	DefaultDLQMaxBytes     = 1 << 30
	DefaultDLQMaxAge       = 7 * 24 * time.Hour
)

// KVMarkerTTL is the limit marker TTL of the runs, threads, checkpoints
// and usage buckets: it lets a key carry its own TTL (a finished run's
// record, usage totals: retention in docs/configuration.md), and is how
// long the marker of a key removed by its TTL, or by a retention sweep,
// is kept so watchers see the removal.
const KVMarkerTTL = 15 * time.Minute

// WithDefaults returns s with zero fields filled.
func (s Settings) WithDefaults() Settings {
	if s.Names.Prefix == "" {
		s.Names = DefaultNames()
	}
	if s.Replicas == 0 {
		s.Replicas = 1
	}
	if s.EventsMaxAge == 0 {
		s.EventsMaxAge = DefaultEventsMaxAge
	}
	if s.DuplicateWindow == 0 {
		s.DuplicateWindow = DefaultDuplicateWindow
	}
	if s.AckWait == 0 {
		s.AckWait = DefaultAckWait
	}
	if s.MaxDeliver == 0 {
		s.MaxDeliver = DefaultMaxDeliver
	}
	if s.MaxAckPending == 0 {
		s.MaxAckPending = DefaultMaxAckPending
	}
	if s.MaxRequestBytes == 0 {
		s.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if s.DLQMaxBytes == 0 {
		s.DLQMaxBytes = DefaultDLQMaxBytes
	}
	if s.DLQMaxAge == 0 {
		s.DLQMaxAge = DefaultDLQMaxAge
	}
	return s
}

// Validate checks settings after defaults.
func (s Settings) Validate() error {
	if s.Replicas != 1 && s.Replicas != 3 {
		return fmt.Errorf("replicas must be 1 or 3, not %d", s.Replicas)
	}
	if s.AckWait < time.Second {
		return fmt.Errorf("ack wait %s is too short: use at least 1s", s.AckWait)
	}
	if s.MaxDeliver < 2 {
		return fmt.Errorf("max deliver %d is too small: a run must survive at least one worker loss", s.MaxDeliver)
	}
	// NATS's own rules for the events stream, checked before any asset
	// is created so a start never half-applies.
	if s.EventsMaxAge < 100*time.Millisecond {
		return fmt.Errorf("events max age %s is too short: use at least 100ms", s.EventsMaxAge)
	}
	if s.DuplicateWindow < 100*time.Millisecond {
		return fmt.Errorf("duplicate window %s is too short: use at least 100ms", s.DuplicateWindow)
	}
	if s.DuplicateWindow > s.EventsMaxAge {
		return fmt.Errorf("duplicate window %s is longer than the events' max age %s: NATS refuses a stream that remembers message ids longer than it keeps messages; lower the duplicate window or raise the events' max age", s.DuplicateWindow, s.EventsMaxAge)
	}
	if s.DLQMaxBytes < 1<<20 {
		return fmt.Errorf("dead-letter max bytes %d is too small: use at least 1 MiB (1048576)", s.DLQMaxBytes)
	}
	if s.DLQMaxAge < time.Minute {
		return fmt.Errorf("dead-letter max age %s is too short: use at least 1m", s.DLQMaxAge)
	}
	return nil
}

// MismatchError reports an existing asset whose configuration differs from
// what this deployment expects. Provisioning never changes it silently.
type MismatchError struct {
	Kind, Name string
	Fields     []string
	// Fix is the exact command that aligns the asset, when one is known.
	Fix string
}

func (e *MismatchError) Error() string {
	if e.Fix != "" {
		return fmt.Sprintf("%s %s exists with a different configuration (%s); align the settings with it, or change it with `%s` and start again",
			e.Kind, e.Name, strings.Join(e.Fields, "; "), e.Fix)
	}
	return fmt.Sprintf("%s %s exists with a different configuration (%s), and not all of it can change in place: align the settings with it, or back its data up, remove it (`%s`) and start again",
		e.Kind, e.Name, strings.Join(e.Fields, "; "), e.removal())
}

// removal is the nats command that removes the asset.
func (e *MismatchError) removal() string {
	switch e.Kind {
	case "bucket":
		return "nats kv rm " + e.Name
	case "object store":
		return "nats object rm " + e.Name
	case "consumer":
		return "nats consumer rm " + strings.Replace(e.Name, "/", " ", 1)
	}
	return "nats stream rm " + e.Name
}

// errCodeNoSuitablePeers is JetStream's refusal to place a replicated
// asset: fewer servers than its replicas are up (or counted up).
const errCodeNoSuitablePeers jetstream.ErrorCode = 10005

// onProvisionRetry, set by tests, is called with the error of each
// attempt Provision makes again.
var onProvisionRetry func(error)

// Provision creates the streams, consumer, buckets and object store, or
// checks that existing ones match. It is safe to call from every process at
// start, concurrently.
//
// What a cluster answers while one of its servers is away (a rolling
// restart, a server slow to answer its peers under load) is tried again
// until ctx ends: a refused placement ("no suitable peers"), no leader yet,
// no answer. A process started meanwhile waits for the server instead of
// exiting. The same refusal also comes from a cluster with fewer servers
// than nats.replicas, so the error at ctx's end says both.
func Provision(ctx context.Context, js jetstream.JetStream, s Settings) error {
	s = s.WithDefaults()
	if err := s.Validate(); err != nil {
		return err
	}
	pause := 100 * time.Millisecond
	for {
		err := provision(ctx, js, s)
		if err == nil || !provisionRetryable(err) {
			return err
		}
		if onProvisionRetry != nil {
			onProvisionRetry(err)
		}
		if !sleepCtx(ctx, pause) {
			return fmt.Errorf("%w (tried again until the deadline: a NATS server may be away, or the cluster has fewer servers than nats.replicas, %d)", err, s.Replicas)
		}
		pause = min(2*pause, 2*time.Second)
	}
}

// provisionRetryable reports an error of Provision that a cluster whose
// servers are all back would not give: a refused placement, no meta
// leader, a request that timed out, a connection reconnecting. Not "no
// responders": a server without JetStream answers that for good, and
// should be told at once.
func provisionRetryable(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case errCodeNoSuitablePeers, errCodeClusterNotAvailable, errCodeClusterIncomplete:
			return true
		}
		return false
	}
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected)
}

// provision is one attempt of Provision, with s validated.
func provision(ctx context.Context, js jetstream.JetStream, s Settings) error {
	n := s.Names
	streams := []jetstream.StreamConfig{
		{
			Name:        n.RunsStream(),
			Description: "natsagent run requests (work queue)",
			Subjects:    []string{n.RunsSubjects()},
			Retention:   jetstream.WorkQueuePolicy,
			Storage:     s.Storage,
			Replicas:    s.Replicas,
			Duplicates:  s.DuplicateWindow,
			AllowDirect: true,
		},
		{
			Name:        n.EventsStream(),
			Description: "natsagent run events",
			Subjects:    []string{n.EventsSubjects()},
			Retention:   jetstream.LimitsPolicy,
			Storage:     s.Storage,
			Replicas:    s.Replicas,
			MaxAge:      s.EventsMaxAge,
			Duplicates:  s.DuplicateWindow,
			AllowDirect: true,
		},
		{
			Name:        n.DLQStream(),
			Description: "natsagent dead-lettered run requests",
			Subjects:    []string{n.DLQSubjects()},
			Retention:   jetstream.LimitsPolicy,
			Storage:     s.Storage,
			Replicas:    s.Replicas,
			AllowDirect: true,
			MaxBytes:    s.DLQMaxBytes,
			MaxAge:      s.DLQMaxAge,
			Discard:     jetstream.DiscardOld,
		},
		{
			// Background jobs (memory extraction). A job waits for its due
			// time as a message schedule, so it is delivered only when due.
			Name:              n.JobsStream(),
			Description:       "natsagent background jobs (work queue)",
			Subjects:          []string{n.JobsSubjects(), n.JobSchedulesSubjects()},
			Retention:         jetstream.WorkQueuePolicy,
			Storage:           s.Storage,
			Replicas:          s.Replicas,
			Duplicates:        s.DuplicateWindow,
			AllowMsgSchedules: true,
		},
	}
	for _, cfg := range streams {
		if err := ensureStream(ctx, js, cfg); err != nil {
			return err
		}
	}
	if err := ensureConsumer(ctx, js, n.RunsStream(), jetstream.ConsumerConfig{
		Durable:       RunsConsumer,
		Description:   "natsagent workers",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.AckWait,
		MaxDeliver:    s.MaxDeliver,
		MaxAckPending: s.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}); err != nil {
		return err
	}
	if err := ensureConsumer(ctx, js, n.JobsStream(), jetstream.ConsumerConfig{
		Durable:       JobsConsumer,
		Description:   "natsagent background jobs",
		FilterSubject: n.JobsSubjects(),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.AckWait,
		// Unlimited: the job runner counts attempts and dead-letters a
		// job itself, so a job is never dropped silently.
		MaxDeliver:    -1,
		MaxAckPending: s.MaxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}); err != nil {
		return err
	}
	for _, b := range []string{n.RunsBucket(), n.ThreadsBucket(), n.CheckpointsBucket(), n.UsageBucket(), n.MemoryBucket(), n.LimitsBucket(), n.AssistantsBucket(), n.CronsBucket(), n.StoreBucket()} {
		cfg := jetstream.KeyValueConfig{
			Bucket:   b,
			History:  1,
			Storage:  s.Storage,
			Replicas: s.Replicas,
		}
		switch b {
		case n.RunsBucket(), n.ThreadsBucket(), n.CheckpointsBucket(), n.UsageBucket(), n.StoreBucket():
			cfg.LimitMarkerTTL = KVMarkerTTL
		}
		if err := ensureBucket(ctx, js, cfg); err != nil {
			return err
		}
	}
	return ensureObjectStore(ctx, js, jetstream.ObjectStoreConfig{
		Bucket:   n.FilesBucket(),
		Storage:  s.Storage,
		Replicas: s.Replicas,
	})
}

func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig) error {
	created, err := js.CreateStream(ctx, want)
	if err == nil {
		if want.AllowMsgSchedules && !created.CachedInfo().Config.AllowMsgSchedules {
			// An older server ignores the setting; jobs would never be due.
			return fmt.Errorf("stream %s needs message schedules, which this NATS server does not support: use nats-server 2.12 or later", want.Name)
		}
		return nil
	}
	if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		if want.MaxBytes > 0 && noRoom(err) {
			return fmt.Errorf("create stream %s: the server cannot reserve its max bytes of %d (%w): lower nats.dlq_max_bytes, or raise the JetStream storage limit of the server (max_file_store, max_memory_store) or of the account",
				want.Name, want.MaxBytes, err)
		}
		return fmt.Errorf("create stream %s: %w", want.Name, err)
	}
	st, err := js.Stream(ctx, want.Name)
	if err != nil {
		return fmt.Errorf("read stream %s: %w", want.Name, err)
	}
	have := st.CachedInfo().Config
	if unbounded(have, want) {
		// A stream created before it had bounds (the dead-letter stream
		// of older versions): setting limits only bounds it, so do it.
		cfg := have
		cfg.MaxBytes, cfg.MaxAge, cfg.Discard = want.MaxBytes, want.MaxAge, want.Discard
		updated, err := js.UpdateStream(ctx, cfg)
		if err != nil {
			hint := "set them with `" + editLimits(want) + "`"
			if noRoom(err) {
				hint = "lower nats.dlq_max_bytes, or raise the JetStream storage limit of the server or the account"
			}
			return fmt.Errorf("stream %s has no size or age limit; setting max bytes %d and max age %s failed: %w (%s)",
				want.Name, want.MaxBytes, want.MaxAge, err, hint)
		}
		have = updated.CachedInfo().Config
	}
	var diff []string
	if strings.Join(have.Subjects, ",") != strings.Join(want.Subjects, ",") {
		diff = append(diff, fmt.Sprintf("subjects %v, want %v", have.Subjects, want.Subjects))
	}
	diff = appendDiff(diff, "retention", have.Retention, want.Retention)
	diff = appendDiff(diff, "storage", have.Storage, want.Storage)
	diff = appendDiff(diff, "replicas", have.Replicas, want.Replicas)
	diff = appendDiff(diff, "duplicate window", have.Duplicates, orDefault(want.Duplicates, 2*time.Minute))
	diff = appendDiff(diff, "allow direct", have.AllowDirect, want.AllowDirect)
	diff = appendDiff(diff, "allow message schedules", have.AllowMsgSchedules, want.AllowMsgSchedules)
	diff = appendDiff(diff, "max age", have.MaxAge, want.MaxAge)
	diff = appendDiff(diff, "max bytes", have.MaxBytes, orDefault(want.MaxBytes, -1))
	diff = appendDiff(diff, "discard policy", have.Discard, want.Discard)
	if len(diff) > 0 {
		return &MismatchError{Kind: "stream", Name: want.Name, Fields: diff, Fix: streamFix(have, want)}
	}
	return nil
}

// streamFix is the nats command that gives an existing stream want's
// settings, or "" when one of them cannot change in place (retention,
// storage, message schedules).
func streamFix(have, want jetstream.StreamConfig) string {
	if have.Retention != want.Retention || have.Storage != want.Storage || have.AllowMsgSchedules != want.AllowMsgSchedules {
		return ""
	}
	var flags []string
	if strings.Join(have.Subjects, ",") != strings.Join(want.Subjects, ",") {
		flags = append(flags, "--subjects="+strings.Join(want.Subjects, ","))
	}
	if have.Replicas != want.Replicas {
		flags = append(flags, fmt.Sprintf("--replicas=%d", want.Replicas))
	}
	if dw := orDefault(want.Duplicates, 2*time.Minute); have.Duplicates != dw {
		flags = append(flags, "--dupe-window="+natsDuration(dw))
	}
	if have.AllowDirect != want.AllowDirect {
		flags = append(flags, map[bool]string{true: "--allow-direct", false: "--no-allow-direct"}[want.AllowDirect])
	}
	if have.MaxAge != want.MaxAge {
		flags = append(flags, "--max-age="+natsDuration(want.MaxAge))
	}
	if mb := orDefault(want.MaxBytes, -1); have.MaxBytes != mb {
		flags = append(flags, "--max-bytes="+natsBytes(mb))
	}
	if have.Discard != want.Discard {
		flags = append(flags, "--discard="+map[jetstream.DiscardPolicy]string{jetstream.DiscardOld: "old", jetstream.DiscardNew: "new"}[want.Discard])
	}
	return fmt.Sprintf("nats stream edit %s %s --force", want.Name, strings.Join(flags, " "))
}

// natsBytes writes n as the nats CLI reads it: with a unit (a bare number
// is refused), in whole GB or MB where it can (the CLI's units are
// binary), since it takes at most 2147483647 plain bytes.
func natsBytes(n int64) string {
	switch {
	case n < 0:
		return "-1"
	case n > 0 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGB", n>>30)
	case n > 0 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMB", n>>20)
	}
	return fmt.Sprintf("%dB", n)
}

// natsDuration writes d as the nats CLI reads it, in whole hours or
// minutes where it can.
func natsDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return d.String()
}

// noRoom reports a server or account refusing to reserve a stream's max
// bytes (insufficient resources, storage or memory resources exceeded).
func noRoom(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case 10023, 10028, 10047:
		return true
	}
	return false
}

// unbounded reports whether have is a stream without size and age limits
// that want bounds.
func unbounded(have, want jetstream.StreamConfig) bool {
	return want.MaxBytes > 0 && have.MaxBytes <= 0 && have.MaxAge == 0
}

func editLimits(want jetstream.StreamConfig) string {
	return fmt.Sprintf("nats stream edit %s --max-bytes=%s --max-age=%s --discard=old --force", want.Name, natsBytes(want.MaxBytes), natsDuration(want.MaxAge))
}

func ensureConsumer(ctx context.Context, js jetstream.JetStream, stream string, want jetstream.ConsumerConfig) error {
	_, err := js.CreateConsumer(ctx, stream, want)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrConsumerExists) && !errors.Is(err, jetstream.ErrConsumerNameAlreadyInUse) {
		return fmt.Errorf("create consumer %s on %s: %w", want.Durable, stream, err)
	}
	c, err := js.Consumer(ctx, stream, want.Durable)
	if err != nil {
		return fmt.Errorf("read consumer %s on %s: %w", want.Durable, stream, err)
	}
	have := c.CachedInfo().Config
	var diff []string
	diff = appendDiff(diff, "ack policy", have.AckPolicy, want.AckPolicy)
	diff = appendDiff(diff, "ack wait", have.AckWait, want.AckWait)
	diff = appendDiff(diff, "max deliver", have.MaxDeliver, want.MaxDeliver)
	diff = appendDiff(diff, "max ack pending", have.MaxAckPending, want.MaxAckPending)
	diff = appendDiff(diff, "filter subject", have.FilterSubject, want.FilterSubject)
	if len(diff) > 0 {
		e := &MismatchError{Kind: "consumer", Name: stream + "/" + want.Durable, Fields: diff}
		if have.AckPolicy == want.AckPolicy {
			e.Fix = consumerFix(stream, have, want)
		}
		return e
	}
	return nil
}

// consumerFix is the nats command that gives an existing consumer want's
// settings (all but its ack policy can change in place).
func consumerFix(stream string, have, want jetstream.ConsumerConfig) string {
	var flags []string
	if have.AckWait != want.AckWait {
		flags = append(flags, "--wait="+natsDuration(want.AckWait))
	}
	if have.MaxDeliver != want.MaxDeliver {
		flags = append(flags, fmt.Sprintf("--max-deliver=%d", want.MaxDeliver))
	}
	if have.MaxAckPending != want.MaxAckPending {
		flags = append(flags, fmt.Sprintf("--max-pending=%d", want.MaxAckPending))
	}
	if have.FilterSubject != want.FilterSubject {
		flags = append(flags, "--filter="+want.FilterSubject)
	}
	return fmt.Sprintf("nats consumer edit %s %s %s --force", stream, want.Durable, strings.Join(flags, " "))
}

func ensureBucket(ctx context.Context, js jetstream.JetStream, want jetstream.KeyValueConfig) error {
	_, err := js.CreateKeyValue(ctx, want)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrBucketExists) {
		return fmt.Errorf("create bucket %s: %w", want.Bucket, err)
	}
	st, err := js.Stream(ctx, "KV_"+want.Bucket)
	if err != nil {
		return fmt.Errorf("read bucket %s: %w", want.Bucket, err)
	}
	have := st.CachedInfo().Config
	if want.LimitMarkerTTL > 0 && (!have.AllowMsgTTL || have.SubjectDeleteMarkerTTL <= 0) {
		// A bucket created before keys had TTLs: allowing them changes
		// nothing that is stored, so do it.
		cfg := have
		cfg.AllowMsgTTL, cfg.SubjectDeleteMarkerTTL = true, want.LimitMarkerTTL
		updated, err := js.UpdateStream(ctx, cfg)
		if err != nil {
			return fmt.Errorf("bucket %s has no per-key TTL; allowing it failed: %w (allow it with `nats stream edit KV_%s --allow-msg-ttl --subject-del-markers-ttl=%s --force`, which needs nats-server 2.11 or later)",
				want.Bucket, err, want.Bucket, natsDuration(want.LimitMarkerTTL))
		}
		have = updated.CachedInfo().Config
	}
	var diff []string
	diff = appendDiff(diff, "history", have.MaxMsgsPerSubject, int64(want.History))
	diff = appendDiff(diff, "storage", have.Storage, want.Storage)
	diff = appendDiff(diff, "replicas", have.Replicas, want.Replicas)
	diff = appendDiff(diff, "ttl", have.MaxAge, want.TTL)
	if len(diff) == 0 {
		// Same essentials; nats.go refused only because of fields it
		// manages itself. Treat the bucket as ours.
		return nil
	}
	e := &MismatchError{Kind: "bucket", Name: want.Bucket, Fields: diff}
	// The nats CLI changes a bucket's history only after asking at a
	// terminal: no command for that.
	if have.Storage == want.Storage && have.MaxMsgsPerSubject == int64(want.History) {
		var flags []string
		if have.Replicas != want.Replicas {
			flags = append(flags, fmt.Sprintf("--replicas=%d", want.Replicas))
		}
		if have.MaxAge != want.TTL {
			flags = append(flags, "--max-age="+natsDuration(want.TTL))
		}
		e.Fix = fmt.Sprintf("nats stream edit KV_%s %s --force", want.Bucket, strings.Join(flags, " "))
	}
	return e
}

func ensureObjectStore(ctx context.Context, js jetstream.JetStream, want jetstream.ObjectStoreConfig) error {
	_, err := js.CreateObjectStore(ctx, want)
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && !errors.Is(err, jetstream.ErrBucketExists) {
		return fmt.Errorf("create object store %s: %w", want.Bucket, err)
	}
	st, err := js.Stream(ctx, "OBJ_"+want.Bucket)
	if err != nil {
		return fmt.Errorf("read object store %s: %w", want.Bucket, err)
	}
	have := st.CachedInfo().Config
	var diff []string
	diff = appendDiff(diff, "storage", have.Storage, want.Storage)
	diff = appendDiff(diff, "replicas", have.Replicas, want.Replicas)
	if len(diff) > 0 {
		e := &MismatchError{Kind: "object store", Name: want.Bucket, Fields: diff}
		if have.Storage == want.Storage {
			e.Fix = fmt.Sprintf("nats stream edit OBJ_%s --replicas=%d --force", want.Bucket, want.Replicas)
		}
		return e
	}
	return nil
}

func appendDiff[T comparable](diff []string, field string, have, want T) []string {
	if have != want {
		diff = append(diff, fmt.Sprintf("%s is %v, want %v", field, have, want))
	}
	return diff
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
