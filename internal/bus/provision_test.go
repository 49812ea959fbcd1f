package bus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func startServer(t *testing.T) jetstream.JetStream {
	t.Helper()
	e, err := StartEmbedded(EmbeddedConfig{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Shutdown)
	nc, err := e.Connect("test")
	return jsOn(t, nc, err)
}

// jsOn is JetStream on a connection just dialled (failing the test on
// err), closed when the test ends.
func jsOn(t *testing.T, nc *nats.Conn, err error) jetstream.JetStream {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func TestProvisionIsIdempotentAndRefusesChanges(t *testing.T) {
	js := startServer(t)
	ctx := context.Background()
	s := Settings{AckWait: 5 * time.Second}
	if err := Provision(ctx, js, s); err != nil {
		t.Fatal(err)
	}
	if err := Provision(ctx, js, s); err != nil {
		t.Fatalf("second provision with the same settings: %v", err)
	}
	// Concurrent starts of several processes.
	errs := make(chan error, 4)
	for range 4 {
		go func() { errs <- Provision(ctx, js, s) }()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent provision: %v", err)
		}
	}
	err := Provision(ctx, js, Settings{AckWait: 9 * time.Second})
	var mm *MismatchError
	if !errors.As(err, &mm) || mm.Kind != "consumer" || !strings.Contains(err.Error(), "ack wait is 5s, want 9s") ||
		mm.Fix != "nats consumer edit AGENT_RUNS workers --wait=9s --force" || !strings.Contains(err.Error(), mm.Fix) {
		t.Fatalf("changed ack wait: %v", err)
	}
	err = Provision(ctx, js, Settings{AckWait: 5 * time.Second, EventsMaxAge: time.Hour})
	if !errors.As(err, &mm) || mm.Name != "AGENT_EVENTS" || !strings.Contains(err.Error(), "max age") ||
		mm.Fix != "nats stream edit AGENT_EVENTS --max-age=1h --force" {
		t.Fatalf("changed events max age: %v", err)
	}
	err = Provision(ctx, js, Settings{AckWait: 5 * time.Second, Storage: jetstream.MemoryStorage})
	if !errors.As(err, &mm) || mm.Fix != "" || !strings.Contains(err.Error(), "`nats stream rm AGENT_RUNS`") {
		t.Fatalf("changed storage: %v", err)
	}
	info, err := js.Stream(ctx, "AGENT_EVENTS")
	if err != nil || info.CachedInfo().Config.MaxAge != DefaultEventsMaxAge {
		t.Fatalf("provision changed an existing stream: %v", err)
	}
}

// A duplicate window longer than the events' max age is refused before
// anything exists: NATS would refuse the events stream after the runs
// stream was created with that window, and the next start with either
// setting corrected would find a stream that does not match.
func TestProvisionChecksNATSRulesBeforeCreatingAnything(t *testing.T) {
	js := startServer(t)
	ctx := context.Background()
	err := Provision(ctx, js, Settings{EventsMaxAge: time.Minute, DuplicateWindow: 10 * time.Minute})
	if err == nil || !strings.Contains(err.Error(), "duplicate window 10m0s is longer than the events' max age 1m0s") {
		t.Fatalf("provision: %v", err)
	}
	if names := js.StreamNames(ctx); names.Err() != nil {
		t.Fatal(names.Err())
	} else {
		for n := range names.Name() {
			t.Errorf("stream %s created", n)
		}
	}
	if err := Provision(ctx, js, Settings{EventsMaxAge: time.Minute, DuplicateWindow: time.Minute}); err != nil {
		t.Fatalf("the corrected settings: %v", err)
	}
}

func TestPrefixSeparatesDeployments(t *testing.T) {
	js := startServer(t)
	ctx := context.Background()
	a, _ := NewNames("alpha")
	b, _ := NewNames("beta")
	for _, n := range []Names{a, b} {
		if err := Provision(ctx, js, Settings{Names: n}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"ALPHA_RUNS", "BETA_RUNS", "ALPHA_EVENTS", "KV_beta_threads", "OBJ_alpha_files"} {
		if _, err := js.Stream(ctx, name); err != nil {
			t.Errorf("stream %s: %v", name, err)
		}
	}
	if _, err := NewNames("bad.prefix"); err == nil {
		t.Fatal("a prefix with a dot must be refused")
	}
	if err := (Settings{Replicas: 2}).WithDefaults().Validate(); err == nil {
		t.Fatal("replicas 2 must be refused")
	}
}

func TestSubjectsRoundTrip(t *testing.T) {
	n := DefaultNames()
	if got := n.RunSubject("acme", "t1"); got != "agent.runs.acme.t1" {
		t.Fatal(got)
	}
	if tn, th, ok := n.ParseRunSubject("agent.runs.acme.t1"); !ok || tn != "acme" || th != "t1" {
		t.Fatal(tn, th, ok)
	}
	if _, _, ok := n.ParseRunSubject("agent.runs.acme.t1.x"); ok {
		t.Fatal("five tokens is not a run subject")
	}
	if tn, th, r, ok := n.ParseCancelSubject(n.CancelSubject("a", "b", "c")); !ok || tn != "a" || th != "b" || r != "c" {
		t.Fatal(tn, th, r, ok)
	}
	if !subjectMatches(n.RunEvents("a", "b", "c"), n.EventSubject("a", "b", "c", "tools")) {
		t.Fatal("run events filter must match a tools event")
	}
	if !subjectMatches(n.ThreadLifecycle("a", "b"), n.EventSubject("a", "b", "r9", "lifecycle")) {
		t.Fatal("thread lifecycle filter must match")
	}
}

// subjectMatches checks a filter against a subject with NATS wildcard
// rules.
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || (tok != "*" && tok != s[i]) {
			return false
		}
	}
	return len(f) == len(s)
}

// A dead-letter stream created by an older version without limits is
// bounded when provisioned; one with other limits is refused with the
// exact command that aligns it.
func TestProvisionBoundsAnExistingDeadLetterStream(t *testing.T) {
	js := startServer(t)
	ctx := context.Background()
	n := DefaultNames()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: n.DLQStream(), Description: "natsagent dead-lettered run requests", Subjects: []string{n.DLQSubjects()},
		Retention: jetstream.LimitsPolicy, AllowDirect: true,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, n.DLQSubject("default", "t1"), []byte("kept")); err != nil {
		t.Fatal(err)
	}
	if err := Provision(ctx, js, Settings{}); err != nil {
		t.Fatalf("provision over an unbounded dead-letter stream: %v", err)
	}
	st, err := js.Stream(ctx, n.DLQStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c := info.Config; c.MaxBytes != DefaultDLQMaxBytes || c.MaxAge != DefaultDLQMaxAge || c.Discard != jetstream.DiscardOld {
		t.Fatalf("dead-letter stream not bounded: max bytes %d, max age %s, discard %v", c.MaxBytes, c.MaxAge, c.Discard)
	}
	if info.State.Msgs != 1 {
		t.Fatalf("bounding the stream lost its dead letters: %d left", info.State.Msgs)
	}
	err = Provision(ctx, js, Settings{DLQMaxBytes: 2 << 30, DLQMaxAge: 24 * time.Hour})
	var mm *MismatchError
	if !errors.As(err, &mm) || mm.Name != n.DLQStream() ||
		mm.Fix != "nats stream edit AGENT_DLQ --max-age=24h --max-bytes=2GB --force" {
		t.Fatalf("changed dead-letter limits: %v", err)
	}
	if !strings.Contains(err.Error(), mm.Fix) {
		t.Fatalf("the error does not name the command: %v", err)
	}
}

// A server that cannot reserve the dead-letter stream's max bytes stops
// provisioning with the setting to lower.
func TestProvisionNamesTheDeadLetterBoundWhenTheServerHasNoRoom(t *testing.T) {
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), JetStreamMaxStore: 64 << 20, NoSigs: true}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(s.Shutdown)
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	err = Provision(context.Background(), js, Settings{})
	if err == nil || !strings.Contains(err.Error(), "lower nats.dlq_max_bytes") {
		t.Fatalf("provision on a 64 MiB server with a 1 GiB dead-letter bound: %v", err)
	}
	if err := Provision(context.Background(), js, Settings{DLQMaxBytes: 16 << 20}); err != nil {
		t.Fatalf("with a bound that fits: %v", err)
	}
}

// The nats CLI refuses a bare byte count and takes at most 2147483647
// plain bytes; these forms were checked with natscli's stream edit (an
// odd size over 2 GiB stays plain, which the CLI refuses).
func TestNatsBytesAsTheCLIReadsThem(t *testing.T) {
	for n, want := range map[int64]string{-1: "-1", 5000: "5000B", 1 << 20: "1MB", 1 << 30: "1GB", 2 << 30: "2GB", 3<<30 + 1: "3221225473B"} {
		if got := natsBytes(n); got != want {
			t.Errorf("natsBytes(%d) = %s, want %s", n, got, want)
		}
	}
}

// Buckets created before keys had TTLs get them in place at the next
// start, keeping their keys; a key written with a TTL then expires
// (nats-server#6920 left such keys forever on 2.11.3).
func TestProvisionAllowsKeyTTLsOnExistingBuckets(t *testing.T) {
	js := startServer(t)
	ctx := context.Background()
	n := DefaultNames()
	old, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: n.RunsBucket(), History: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Put(ctx, "default.kept", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := Provision(ctx, js, Settings{}); err != nil {
		t.Fatalf("provision over a bucket without key TTLs: %v", err)
	}
	for _, b := range []string{n.RunsBucket(), n.ThreadsBucket(), n.CheckpointsBucket(), n.UsageBucket()} {
		st, err := js.Stream(ctx, "KV_"+b)
		if err != nil {
			t.Fatal(err)
		}
		if c := st.CachedInfo().Config; !c.AllowMsgTTL || c.SubjectDeleteMarkerTTL != KVMarkerTTL {
			t.Fatalf("bucket %s: allow msg ttl %v, marker ttl %s", b, c.AllowMsgTTL, c.SubjectDeleteMarkerTTL)
		}
	}
	if err := Provision(ctx, js, Settings{}); err != nil {
		t.Fatalf("provision again: %v", err)
	}
	kv, err := js.KeyValue(ctx, n.RunsBucket())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "default.brief", []byte("{}"), jetstream.KeyTTL(time.Second)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := kv.Get(ctx, "default.brief")
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a key with a 1s TTL is still there after 30s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, err := kv.Get(ctx, "default.kept"); err != nil {
		t.Fatalf("the key written before lost: %v", err)
	}
}

// TestProvisionWaitsForAbsentClusterPeers: a process that starts while
// its cluster cannot place a replicated asset (two of three servers away
// in a rolling restart: "no suitable peers for placement", or no meta
// leader) keeps trying within its deadline and provisions once the
// servers are back, rather than exiting.
func TestProvisionWaitsForAbsentClusterPeers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := StartCluster(ctx, ClusterConfig{Dir: t.TempDir(), Nodes: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var leader *server.Server
	for leader == nil && ctx.Err() == nil {
		if leader = c.Leader(); leader == nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
	nc, err := Connect(leader.ClientURL(), "provision-test")
	js := jsOn(t, nc, err)
	var away []string
	for _, name := range c.Names() {
		if name != leader.Name() {
			if err := c.Shutdown(name); err != nil {
				t.Fatal(err)
			}
			away = append(away, name)
		}
	}
	// Wait until the cluster refuses a replicated stream, as Provision
	// will be refused.
	deadline := time.Now().Add(time.Minute)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.CreateStream(pctx, jetstream.StreamConfig{Name: "PROBE", Subjects: []string{"probe.>"}, Replicas: 3})
		cancel()
		if err != nil {
			t.Logf("with %v away: %v", away, err)
			break
		}
		_ = js.DeleteStream(ctx, "PROBE")
		if time.Now().After(deadline) {
			t.Fatalf("a replicated stream is still placed with %v away", away)
		}
		time.Sleep(200 * time.Millisecond)
	}

	prov, err := NewNames("prov")
	if err != nil {
		t.Fatal(err)
	}
	retried := make(chan error, 1)
	onProvisionRetry = func(err error) {
		select {
		case retried <- err:
		default:
		}
	}
	t.Cleanup(func() { onProvisionRetry = nil })
	done := make(chan error, 1)
	go func() {
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		done <- Provision(pctx, js, Settings{Names: prov, Replicas: 3})
	}()
	select {
	case err := <-retried:
		t.Logf("Provision tries again after: %v", err)
	case err := <-done:
		t.Fatalf("Provision returned %v with two servers away, want it to wait for them", err)
	case <-ctx.Done():
		t.Fatal("Provision neither tried again nor returned")
	}
	for _, name := range away {
		if _, err := c.Restart(name); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Provision after the servers came back: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Provision did not finish after the servers came back")
	}
	if _, err := js.Stream(ctx, prov.RunsStream()); err != nil {
		t.Errorf("runs stream after Provision: %v", err)
	}
}

// TestProvisionRetriesOnlyWhatAClusterOutgrows: a refusal a cluster gives
// while servers are away is tried again; a server without JetStream (no
// responders), a refused configuration and the caller's own deadline are
// not.
func TestProvisionRetriesOnlyWhatAClusterOutgrows(t *testing.T) {
	api := func(code jetstream.ErrorCode) error {
		return fmt.Errorf("create stream X: %w", &jetstream.APIError{Code: 503, ErrorCode: code})
	}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{api(errCodeNoSuitablePeers), true},
		{api(errCodeClusterNotAvailable), true},
		{api(errCodeClusterIncomplete), true},
		{fmt.Errorf("read stream: %w", nats.ErrTimeout), true},
		{nats.ErrConnectionReconnecting, true},
		{fmt.Errorf("create stream X: %w", nats.ErrNoResponders), false},
		{api(10074), false}, // replicas > 1 not supported in non-clustered mode
		{api(10058), false}, // stream name already in use with a different configuration
		{context.DeadlineExceeded, false},
		{context.Canceled, false},
	} {
		if got := provisionRetryable(c.err); got != c.want {
			t.Errorf("provisionRetryable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
