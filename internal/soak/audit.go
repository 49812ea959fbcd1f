package soak

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// RunRef names one submitted run.
type RunRef struct {
	Tenant, Thread, Run string
}

// Audit is what the stored events and run records say about a set of
// submitted runs: the guarantees of docs/operations.md checked from the
// outside, the way any client could.
type Audit struct {
	Submitted int
	Succeeded int
	// Failed counts runs that ended in another terminal status, by
	// "<status>: <reason>".
	Failed map[string]int
	// Lost are runs with no run.finished event or no terminal record.
	Lost []string
	// Duplicated are runs with more than one run.finished event.
	Duplicated []string
	// Overlapping are runs that executed while another run of their
	// thread did: "<run> started while <other> ran".
	Overlapping []string
	// Mismatched are runs whose run.finished and record disagree on the
	// status.
	Mismatched []string
	// Gaps are runs whose event seqs skip a number (an event not stored).
	Gaps []string
	// Marked are runs with event.lost events: events their dead worker
	// published but the stream never stored, marked by the worker that
	// took the run over ("<run> (<n> events)").
	Marked []string
	// Attempts counts runs by how many attempts ran them (run.started).
	Attempts map[int]int
	// Stale are runs with events of an older attempt stored after a
	// newer attempt's run.started: what a paused or cut-off worker
	// published after the takeover ("<run> (<n> events)").
	Stale []string
	// Repeated are runs with a seq stored twice: two attempts numbering
	// the same seq (also counted stale), or an event.lost marker for an
	// event that was stored after all (a worker cut off from NATS while
	// it finished the run flushes it late, after the run's redelivered
	// request had the gap marked). Reported, not failed on: the markers
	// are the known trade-off of gapless seqs (docs/operations.md).
	Repeated []string
	// AttemptOverlaps are runs two attempts of which called the model at
	// the same time (CallLog.Overlaps; set by the soak, which sees the
	// model calls: the events alone do not show them).
	AttemptOverlaps []string
}

// OK reports whether the audit found nothing lost, duplicated,
// overlapping or inconsistent.
func (a *Audit) OK() bool {
	return len(a.Lost) == 0 && len(a.Duplicated) == 0 && len(a.Overlapping) == 0 && len(a.Mismatched) == 0 &&
		len(a.Stale) == 0 && len(a.AttemptOverlaps) == 0
}

// Summary is the audit in a few lines.
func (a *Audit) Summary() string {
	var b strings.Builder
	failed := 0
	for _, n := range a.Failed {
		failed += n
	}
	fmt.Fprintf(&b, "submitted %d, succeeded %d, failed %d, lost %d, duplicated %d, overlapping %d, overlapping attempts %d, stale events visible %d, repeated seqs %d, inconsistent %d, event gaps %d, events marked lost %d\n",
		a.Submitted, a.Succeeded, failed, len(a.Lost), len(a.Duplicated), len(a.Overlapping), len(a.AttemptOverlaps), len(a.Stale), len(a.Repeated), len(a.Mismatched), len(a.Gaps), len(a.Marked))
	if len(a.Attempts) > 0 {
		var parts []string
		for n := 0; n <= 64; n++ {
			if c := a.Attempts[n]; c > 0 {
				parts = append(parts, fmt.Sprintf("%d: %d", n, c))
			}
		}
		fmt.Fprintf(&b, "runs by attempts: %s\n", strings.Join(parts, ", "))
	}
	for _, r := range sortedKeys(a.Failed) {
		fmt.Fprintf(&b, "  failed %5d  %s\n", a.Failed[r], r)
	}
	for _, l := range []struct {
		name string
		runs []string
	}{{"lost", a.Lost}, {"duplicated", a.Duplicated}, {"overlapping", a.Overlapping}, {"overlapping attempts", a.AttemptOverlaps},
		{"stale events visible", a.Stale}, {"repeated seqs", a.Repeated}, {"inconsistent", a.Mismatched}, {"event gaps", a.Gaps}, {"events marked lost", a.Marked}} {
		if len(l.runs) > 0 {
			fmt.Fprintf(&b, "  %s: %s\n", l.name, clipList(l.runs, 10))
		}
	}
	return b.String()
}

// runTrace is what the events say about one run.
type runTrace struct {
	thread   string
	finished []protocol.FinishedData
	// start is when the first run.started was emitted, last when the
	// last event before run.finished was (the run executed in between).
	// Emit times, not stream order: a worker flushes a run's events after
	// it released the thread, so the next run's run.started may be stored
	// before them without the runs having overlapped.
	start, last time.Time
	// startSeq is the stream sequence of the first run.started; lastSeq
	// of the last event before run.finished (the run executed in
	// between).
	startSeq, lastSeq uint64
	started           int
	lost              int // event.lost events
	seqs              map[uint64]bool
	// newest is the highest attempt of a run.started stored so far (in
	// stream order); stale counts the events of an older attempt stored
	// after it, repeats the seqs stored more than once.
	newest, stale, repeats int
	// first is the type and attempt of the first event stored per seq,
	// and repeated describes the first few seqs stored again.
	first    map[uint64]string
	repeated []string
}

// RunAudit reads every event of the deployment's events stream and the
// records of runs, and checks each run.
func RunAudit(ctx context.Context, js jetstream.JetStream, names bus.Names, runs []RunRef) (*Audit, error) {
	stores, err := kv.Open(ctx, js, names)
	if err != nil {
		return nil, err
	}
	// Just after a node loss, the API may not answer for a moment.
	var traces map[string]*runTrace
	for {
		traces, err = readTraces(ctx, js, names)
		if err == nil {
			break
		}
		if !bus.Transient(err) || ctx.Err() != nil {
			return nil, err
		}
		time.Sleep(250 * time.Millisecond)
	}
	a := &Audit{Submitted: len(runs), Failed: map[string]int{}, Attempts: map[int]int{}}
	byThread := map[string][]string{}
	for _, ref := range runs {
		key := bus.Key(ref.Tenant, ref.Run)
		tr := traces[key]
		rec, err := getRecord(ctx, stores, ref)
		if err != nil && !errors.Is(err, kv.ErrNotFound) {
			return nil, fmt.Errorf("read run record %s: %w", ref.Run, err)
		}
		switch {
		case tr == nil || len(tr.finished) == 0 || rec == nil || !rec.Status.Terminal():
			// The record decides (run.finished follows the terminal
			// record); the view says what a client sees of a run whose
			// record is pending or missing (protocol v2).
			view := rec
			if th, _, err := stores.Threads.Get(ctx, ref.Tenant, ref.Thread); err == nil {
				view = protocol.RunView(ref.Run, rec, th)
			}
			a.Lost = append(a.Lost, ref.Run+lostWhy(tr, view)+requestState(ctx, js, names, view))
			continue
		case len(tr.finished) > 1:
			a.Duplicated = append(a.Duplicated, fmt.Sprintf("%s (%d run.finished)", ref.Run, len(tr.finished)))
		}
		fin := tr.finished[0]
		if fin.Status != rec.Status {
			a.Mismatched = append(a.Mismatched, fmt.Sprintf("%s (event %s, record %s)", ref.Run, fin.Status, rec.Status))
		}
		if fin.Status == protocol.StatusSuccess {
			a.Succeeded++
		} else {
			a.Failed[failure(fin)]++
		}
		a.Attempts[tr.started]++
		if tr.lost > 0 {
			a.Marked = append(a.Marked, fmt.Sprintf("%s (%d events)", ref.Run, tr.lost))
		}
		if tr.stale > 0 {
			a.Stale = append(a.Stale, fmt.Sprintf("%s (%d events)", ref.Run, tr.stale))
		}
		if tr.repeats > 0 {
			a.Repeated = append(a.Repeated, fmt.Sprintf("%s (%d seqs: %s)", ref.Run, tr.repeats, strings.Join(tr.repeated, "; ")))
		}
		for i := uint64(1); i <= uint64(len(tr.seqs)); i++ {
			if !tr.seqs[i] {
				a.Gaps = append(a.Gaps, fmt.Sprintf("%s (no event seq %d)", ref.Run, i))
				break
			}
		}
		if tr.started > 0 {
			byThread[bus.Key(ref.Tenant, ref.Thread)] = append(byThread[bus.Key(ref.Tenant, ref.Thread)], key)
		}
	}
	// Two runs of a thread overlap when one started before the other's
	// last event was emitted.
	for _, keys := range byThread {
		sort.Slice(keys, func(i, j int) bool { return traces[keys[i]].start.Before(traces[keys[j]].start) })
		busy := keys[0] // the run that ran last so far
		for _, k := range keys[1:] {
			if traces[k].start.Before(traces[busy].last) {
				a.Overlapping = append(a.Overlapping, fmt.Sprintf("%s started while %s ran", runOf(k), runOf(busy)))
			}
			if traces[k].last.After(traces[busy].last) {
				busy = k
			}
		}
	}
	sort.Strings(a.Lost)
	sort.Strings(a.Duplicated)
	return a, nil
}

// Settled counts the runs of refs that are over as far as a client can
// tell: a terminal record and a run.finished event stored (the worker
// writes the record first). Read errors count as not settled.
func Settled(ctx context.Context, js jetstream.JetStream, names bus.Names, refs []RunRef) int {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	stores, err := kv.Open(ctx, js, names)
	if err != nil {
		return 0
	}
	n := 0
	for _, ref := range refs {
		rec, _, err := stores.Runs.Get(ctx, ref.Tenant, ref.Run)
		if err != nil || !rec.Status.Terminal() {
			continue
		}
		m, err := bus.GetMsgFromLeader(ctx, js, names.EventsStream(), bus.MsgQuery{LastBySubject: names.EventSubject(ref.Tenant, ref.Thread, ref.Run, protocol.KindLifecycle)})
		if err != nil {
			continue
		}
		var ev protocol.Event
		if json.Unmarshal(m.Data, &ev) == nil && ev.Type == protocol.EventRunFinished {
			n++
		}
	}
	return n
}

func lostWhy(tr *runTrace, rec *protocol.Run) string {
	switch {
	case rec == nil:
		return " (no record)"
	case !rec.Status.Terminal():
		return " (record " + string(rec.Status) + ")"
	case tr == nil:
		return " (no event)"
	default:
		return " (no run.finished)"
	}
}

// requestState says, for a run that never ended, where its request is:
// still in the runs stream or gone, and where the workers' consumer
// stands, so a lost run can be told apart as undelivered (the request
// waits below the consumer's ack floor), dropped, or still in progress.
func requestState(ctx context.Context, js jetstream.JetStream, names bus.Names, rec *protocol.Run) string {
	if rec == nil || rec.MsgSeq == 0 {
		return ""
	}
	where := "request gone from the stream"
	if _, err := bus.GetMsgFromLeader(ctx, js, names.RunsStream(), bus.MsgQuery{Seq: rec.MsgSeq}); err == nil {
		where = "request still in the stream"
	}
	c, err := js.Consumer(ctx, names.RunsStream(), bus.RunsConsumer)
	if err != nil {
		return fmt.Sprintf(" [seq %d: %s]", rec.MsgSeq, where)
	}
	info, err := c.Info(ctx)
	if err != nil {
		return fmt.Sprintf(" [seq %d: %s]", rec.MsgSeq, where)
	}
	return fmt.Sprintf(" [seq %d: %s; consumer delivered %d, ack floor %d, %d pending, %d awaiting ack, %d redelivered]",
		rec.MsgSeq, where, info.Delivered.Stream, info.AckFloor.Stream, info.NumPending, info.NumAckPending, info.NumRedelivered)
}

func getRecord(ctx context.Context, stores *kv.Stores, ref RunRef) (*protocol.Run, error) {
	var err error
	for range 20 {
		var rec *protocol.Run
		rec, _, err = stores.Runs.Get(ctx, ref.Tenant, ref.Run)
		if err == nil || errors.Is(err, kv.ErrNotFound) {
			return rec, err
		}
		if ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, err
}

// readTraces reads the events stream from its first message to its last.
func readTraces(ctx context.Context, js jetstream.JetStream, names bus.Names) (map[string]*runTrace, error) {
	st, err := js.Stream(ctx, names.EventsStream())
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, err
	}
	traces := map[string]*runTrace{}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return traces, nil
	}
	oc, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{names.EventsSubjects()}})
	if err != nil {
		return nil, err
	}
	for {
		batch, err := oc.Fetch(1000, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			md, err := m.Metadata()
			if err != nil {
				return nil, err
			}
			var ev protocol.Event
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				return nil, fmt.Errorf("event %d is not an envelope: %w", md.Sequence.Stream, err)
			}
			key := bus.Key(ev.Tenant, ev.RunID)
			tr := traces[key]
			if tr == nil {
				tr = &runTrace{thread: ev.ThreadID, seqs: map[uint64]bool{}, first: map[uint64]string{}}
				traces[key] = tr
			}
			what := fmt.Sprintf("%s of attempt %d", ev.Type, ev.Attempt)
			if tr.seqs[ev.Seq] {
				if tr.repeats++; len(tr.repeated) < 3 {
					tr.repeated = append(tr.repeated, fmt.Sprintf("%d %s, then %s", ev.Seq, tr.first[ev.Seq], what))
				}
			} else {
				tr.first[ev.Seq] = what
			}
			tr.seqs[ev.Seq] = true
			switch {
			case ev.Type == protocol.EventRunStarted && ev.Attempt > tr.newest:
				tr.newest = ev.Attempt
			case ev.Type == protocol.EventRunFinished || ev.Type == protocol.EventRunQueued:
			case ev.Attempt < tr.newest:
				tr.stale++
			}
			switch ev.Type {
			case protocol.EventRunFinished:
				var d protocol.FinishedData
				_ = json.Unmarshal(ev.Data, &d)
				tr.finished = append(tr.finished, d)
			case protocol.EventLost:
				tr.lost++
			case protocol.EventRunStarted:
				tr.started++
				if tr.startSeq == 0 {
					tr.startSeq = md.Sequence.Stream
					tr.start = ev.Time
				}
				tr.lastSeq = md.Sequence.Stream
				if ev.Time.After(tr.last) {
					tr.last = ev.Time
				}
			case protocol.EventRunQueued:
			default:
				tr.lastSeq = md.Sequence.Stream
				if ev.Time.After(tr.last) {
					tr.last = ev.Time
				}
			}
			if md.Sequence.Stream >= last {
				return traces, nil
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		if got == 0 {
			return nil, fmt.Errorf("events stream: stopped before its last message %d", last)
		}
	}
}

func runOf(key string) string { return key[strings.LastIndexByte(key, '.')+1:] }

// failure is the group of a run that did not succeed: its status and the
// first line of its reason, without run-specific ids.
func failure(d protocol.FinishedData) string {
	reason := d.Error
	if d.StopReason != "" {
		reason = d.StopReason
	}
	if i := strings.IndexByte(reason, '\n'); i >= 0 {
		reason = reason[:i]
	}
	if len(reason) > 120 {
		reason = reason[:120] + "..."
	}
	if reason == "" {
		return string(d.Status)
	}
	return string(d.Status) + ": " + reason
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func clipList(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:n], ", ") + fmt.Sprintf(", ... (%d more)", len(items)-n)
}
