package events

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natsagent/natsagent/internal/protocol"
)

// The merger's rule, with crafted envelopes of one run "r" in the order a
// reader may receive them: stored events from the feed, live ones from
// the subscription, each in its own order, interleaved any way.

func storedEnv(seq uint64, attempt int, typ, data string) []byte {
	e := protocol.Event{Type: typ, Seq: seq, RunID: "r", ThreadID: "t", Tenant: "d", Attempt: attempt, Time: time.Unix(0, 0).UTC()}
	if data != "" {
		e.Data = json.RawMessage(data)
	}
	return AppendEnvelope(nil, &e)
}

func liveDelta(after, index uint64, attempt int, msg, text string) []byte {
	e := protocol.Event{Type: protocol.EventMessageDelta, Live: true, After: after, Index: index, RunID: "r", ThreadID: "t", Tenant: "d",
		Attempt: attempt, Time: time.Unix(0, 0).UTC(), Data: json.RawMessage(fmt.Sprintf(`{"message_id":%q,"delta":%q}`, msg, text))}
	return AppendEnvelope(nil, &e)
}

// feedMerger replays steps ("s" stored, "l" live) and names what comes
// out: a stored event by its seq ("#3"), a live one by its text.
type step struct {
	live bool
	data []byte
}

func st(seq uint64, attempt int, typ, data string) step {
	return step{data: storedEnv(seq, attempt, typ, data)}
}

func lv(after, index uint64, attempt int, msg, text string) step {
	return step{live: true, data: liveDelta(after, index, attempt, msg, text)}
}

func replay(m *merger, steps ...step) string {
	var out []Item
	for i, s := range steps {
		if s.live {
			out = m.live(out, s.data)
		} else {
			out = m.stored(out, s.data, uint64(100+i))
		}
	}
	var names []string
	for _, it := range out {
		var env struct {
			Seq  uint64 `json:"seq"`
			Data struct {
				Delta string `json:"delta"`
			} `json:"data"`
		}
		_ = json.Unmarshal(it.Data, &env)
		if it.Live {
			if it.StreamSeq != 0 {
				return "a live item with a stream sequence"
			}
			names = append(names, env.Data.Delta)
		} else {
			names = append(names, fmt.Sprintf("#%d", env.Seq))
		}
	}
	return strings.Join(names, " ")
}

const completedM1 = `{"id":"m1","role":"assistant","content":"abc"}`

// The stream a person saw when deltas were stored: run.started, the
// deltas, message.completed, run.finished.
const wantStream = "#1 #2 a b c #3 #4"

func TestMergeLiveBeforeTheStoredEventItFollows(t *testing.T) {
	// The deltas (after #2) overtake run.queued and run.started.
	got := replay(&merger{fromStart: true},
		lv(2, 1, 1, "m1", "a"), lv(2, 2, 1, "m1", "b"),
		st(1, 0, protocol.EventRunQueued, ""),
		lv(2, 3, 1, "m1", "c"),
		st(2, 1, protocol.EventRunStarted, `{"attempt":1}`),
		st(3, 1, protocol.EventMessageCompleted, completedM1),
		st(4, 1, protocol.EventRunFinished, `{"status":"success"}`))
	if got != wantStream {
		t.Fatalf("got %q, want %q", got, wantStream)
	}
}

func TestMergeLiveAfterTheStoredEventsAroundIt(t *testing.T) {
	// The deltas arrive late: the first after its stored event, the last
	// after the message.completed that repeats them (dropped).
	got := replay(&merger{fromStart: true},
		st(1, 0, protocol.EventRunQueued, ""),
		st(2, 1, protocol.EventRunStarted, `{"attempt":1}`),
		lv(2, 1, 1, "m1", "a"), lv(2, 2, 1, "m1", "b"),
		st(3, 1, protocol.EventMessageCompleted, completedM1),
		lv(2, 3, 1, "m1", "c"),
		st(4, 1, protocol.EventRunFinished, `{"status":"success"}`),
		lv(4, 4, 1, "m2", "late"))
	if want := "#1 #2 a b #3 #4"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestMergeOrdersAndDedupesLiveEvents(t *testing.T) {
	got := replay(&merger{fromStart: true},
		st(1, 0, protocol.EventRunQueued, ""),
		lv(2, 2, 1, "m1", "b"), lv(2, 1, 1, "m1", "a"), lv(2, 2, 1, "m1", "b"), lv(2, 3, 1, "m1", "c"),
		st(2, 1, protocol.EventRunStarted, `{"attempt":1}`),
		lv(2, 3, 1, "m1", "c"), // a repeat after delivery
		st(3, 1, protocol.EventMessageCompleted, completedM1),
		st(4, 1, protocol.EventRunFinished, `{"status":"success"}`))
	if got != wantStream {
		t.Fatalf("got %q, want %q", got, wantStream)
	}
}

func TestMergeDropsTheLiveEventsOfAStaleAttempt(t *testing.T) {
	// Attempt 1 was taken over at #3; its worker, paused past its lease,
	// still streams. Attempt 2's deltas come before its run.started.
	got := replay(&merger{fromStart: true},
		st(1, 0, protocol.EventRunQueued, ""),
		st(2, 1, protocol.EventRunStarted, `{"attempt":1}`),
		lv(2, 1, 1, "m1", "old1"),
		lv(3, 1, 2, "m2", "x"),
		st(3, 2, protocol.EventRunStarted, `{"attempt":2}`),
		lv(2, 2, 1, "m1", "old2"),
		lv(3, 2, 2, "m2", "y"),
		st(4, 2, protocol.EventMessageCompleted, `{"id":"m2","content":"xy"}`),
		st(5, 2, protocol.EventRunFinished, `{"status":"success"}`))
	if want := "#1 #2 old1 #3 x y #4 #5"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestMergeWithoutAKnownStart(t *testing.T) {
	// A reader that starts mid-run (tail of new events) cannot place a
	// live event before it sees a stored one: it goes out at once.
	got := replay(&merger{},
		lv(7, 4, 1, "m1", "d"),
		st(8, 1, protocol.EventMessageCompleted, completedM1),
		lv(7, 5, 1, "m1", "e"))
	if want := "d #8"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	// A reader resuming after #7 (SawSeq) holds a delta after #8 until
	// #8 comes.
	m := &merger{}
	v := m.view("d", "r")
	v.known, v.seq = true, 7
	got = replay(m,
		lv(7, 4, 1, "m1", "d"),
		lv(8, 5, 1, "m2", "x"),
		st(8, 1, protocol.EventMessageCompleted, completedM1),
		st(9, 1, protocol.EventRunFinished, `{"status":"success"}`))
	if want := "d #8 x #9"; got != want {
		t.Fatalf("resumed: got %q, want %q", got, want)
	}
}

func TestMergeKeepsRunsApart(t *testing.T) {
	m := &merger{fromStart: true}
	other := protocol.Event{Type: protocol.EventMessageDelta, Live: true, After: 2, Index: 1, RunID: "r2", ThreadID: "t", Tenant: "d",
		Attempt: 1, Time: time.Unix(0, 0).UTC(), Data: json.RawMessage(`{"message_id":"m9","delta":"z"}`)}
	var out []Item
	out = m.stored(out, storedEnv(1, 0, protocol.EventRunQueued, ""), 1)
	out = m.stored(out, storedEnv(2, 1, protocol.EventRunStarted, `{"attempt":1}`), 2)
	// r2 is at seq 0: its delta after #2 waits, r's goes out.
	out = m.live(out, AppendEnvelope(nil, &other))
	out = m.live(out, liveDelta(2, 1, 1, "m1", "a"))
	if len(out) != 3 || !out[2].Live || !strings.Contains(string(out[2].Data), `"delta":"a"`) {
		t.Fatalf("got %d items, the last %s", len(out), out[len(out)-1].Data)
	}
	if held := m.runs["d.r2"].held; len(held) != 1 {
		t.Fatalf("r2 holds %d live events", len(held))
	}
	// A tenant's run of the same id is another run.
	if slices.ContainsFunc(out, func(it Item) bool { return strings.Contains(string(it.Data), `"delta":"z"`) }) {
		t.Fatal("r2's delta went out before its stored event")
	}
}
