package kv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/protocol"
)

// leaderGets counts the reads through a bucket's stream leader (the
// JetStream API's message gets), as the server sees them.
type leaderGets struct {
	t   *testing.T
	nc  *nats.Conn
	sub *nats.Subscription
}

func countLeaderGets(t *testing.T, nc *nats.Conn, bucket string) *leaderGets {
	t.Helper()
	sub, err := nc.SubscribeSync("$JS.API.STREAM.MSG.GET.KV_" + bucket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &leaderGets{t: t, nc: nc, sub: sub}
}

// take returns the number of gets since the last take. The requests were
// sent on nc before the flush, so the server delivered them before its
// answer to it.
func (g *leaderGets) take() int {
	g.t.Helper()
	if err := g.nc.Flush(); err != nil {
		g.t.Fatal(err)
	}
	n := 0
	for {
		if _, err := g.sub.NextMsg(0); err != nil {
			return n
		}
		n++
	}
}

// A plain read of a missing record (a deleted run, a thread never
// created) asks the leader once and answers ErrNotFound: it does not
// wait settleWait for a write in flight, which only a refused create or
// update says there is. Before, the client's Thread and the gateway's run
// reads used GetLatest there and spent 2 s on every miss.
func TestLeaderReadOfAMissingRecordIsOneRead(t *testing.T) {
	defer func(d time.Duration) { settleWait = d }(settleWait)
	settleWait = time.Minute // a read that waits would take this long
	s := openStores(t)
	ctx := context.Background()
	nc := s.Runs.js.Conn()
	runs := countLeaderGets(t, nc, s.Runs.bucket)
	threads := countLeaderGets(t, nc, s.Threads.bucket)

	if _, _, err := s.Runs.GetFromLeader(ctx, "default", "gone"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Runs.GetFromLeader of a missing run: %v", err)
	}
	if n := runs.take(); n != 1 {
		t.Fatalf("Runs.GetFromLeader: %d leader reads, want 1", n)
	}
	if _, _, err := s.Threads.GetFromLeader(ctx, "default", "gone"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Threads.GetFromLeader of a missing thread: %v", err)
	}
	if n := threads.take(); n != 1 {
		t.Fatalf("Threads.GetFromLeader: %d leader reads, want 1", n)
	}
	if _, err := s.RunOfThread(ctx, "default", "t1", "gone"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("RunOfThread of a missing run: %v", err)
	}
	if n := runs.take(); n != 1 {
		t.Fatalf("RunOfThread: %d leader reads of the run, want 1", n)
	}

	// A deleted record reads the same.
	r := &protocol.Run{RunID: "r1", ThreadID: "t1", Tenant: "default", Status: protocol.StatusSuccess, CreatedAt: time.Now()}
	if _, err := s.Runs.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := s.Runs.kv.Delete(ctx, "default.r1"); err != nil {
		t.Fatal(err)
	}
	runs.take()
	if _, err := s.RunOfThread(ctx, "default", "t1", "r1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("RunOfThread of a deleted run: %v", err)
	}
	if n := runs.take(); n != 1 {
		t.Fatalf("RunOfThread of a deleted run: %d leader reads, want 1", n)
	}
}

// What GetLatest's wait protects: after a create refused because another
// write of the key is in flight, the leader may not hold that write yet;
// GetLatest keeps asking until it does (within settleWait). Here the
// write lands after GetLatest's first read found nothing.
func TestGetLatestWaitsForAWriteInFlight(t *testing.T) {
	defer func(d time.Duration) { settleWait = d }(settleWait)
	settleWait = time.Minute // the write lands within it however loaded the machine
	s := openStores(t)
	ctx := context.Background()
	runs := countLeaderGets(t, s.Runs.js.Conn(), s.Runs.bucket)

	type result struct {
		rec *protocol.Run
		err error
	}
	got := make(chan result, 1)
	go func() {
		rec, _, err := s.Runs.GetLatest(ctx, "default", "late")
		got <- result{rec, err}
	}()
	if _, err := runs.sub.NextMsg(natstest.Patience); err != nil {
		t.Fatalf("GetLatest did not read: %v", err)
	}
	if _, err := s.Runs.Create(ctx, &protocol.Run{RunID: "late", ThreadID: "t1", Tenant: "default", Status: protocol.StatusPending, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	res := natstest.Recv(t, got, "GetLatest to answer")
	if res.err != nil || res.rec.RunID != "late" {
		t.Fatalf("GetLatest answered %+v, %v: want the record written while it waited", res.rec, res.err)
	}
}

// A refused create's read that finds a delete or purge marker above the
// revision it waits to pass has its answer: the key was deleted (or is
// free). It returns ErrNotFound after one leader read instead of asking
// again until settleWait ends.
func TestGetLatestAnswersADeleteMarkerAtOnce(t *testing.T) {
	defer func(d time.Duration) { settleWait = d }(settleWait)
	settleWait = 10 * time.Minute // a read that waits the settle outlives ctx
	s := openStores(t)
	ctx, cancel := context.WithTimeout(context.Background(), natstest.Patience)
	defer cancel()
	for i, remove := range []func(string) error{
		func(k string) error { return s.Runs.kv.Delete(ctx, k) },
		func(k string) error { return s.Runs.kv.Purge(ctx, k) },
	} {
		id := []string{"deleted", "purged"}[i]
		if _, err := s.Runs.Create(ctx, &protocol.Run{RunID: id, ThreadID: "t1", Tenant: "default", Status: protocol.StatusSuccess, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		if err := remove("default." + id); err != nil {
			t.Fatal(err)
		}
		runs := countLeaderGets(t, s.Runs.js.Conn(), s.Runs.bucket)
		if _, _, err := s.Runs.GetLatest(ctx, "default", id); !errors.Is(err, ErrNotFound) {
			t.Fatalf("GetLatest of a %s run: %v, want ErrNotFound at once", id, err)
		}
		if n := runs.take(); n != 1 {
			t.Fatalf("GetLatest of a %s run: %d leader reads, want 1", id, n)
		}
	}
}
