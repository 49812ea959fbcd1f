package protocol

// Since protocol v2 a run's record is written twice at most: pending when
// a submitter announces the run (the gateway, the submit service), and
// terminal at its end. While the run runs, its thread's lease says so; in
// the moment between the write that releases the thread and the terminal
// record, the thread's last_run does. RunView puts the three together into
// the record a v1 reader saw, so every reader shows a run the same way.

// RunView is the run runID as clients see it, from its record rec (nil
// when there is none) and its thread's record th (nil when unknown):
//   - a terminal record is the answer as it is;
//   - a run named by th.LastRun has ended: the record's fields with the
//     terminal summary over them (the record is written next);
//   - a run holding th's lease is running: the record (or, when there is
//     none yet, what the lease knows of the run) with the attempt, start,
//     worker and epoch of the lease;
//   - otherwise rec (nil when there is none).
//
// A running record written by a protocol v1 worker reads as it is. The
// result may be rec itself: copy it before editing it.
func RunView(runID string, rec *Run, th *Thread) *Run {
	if rec != nil && rec.Status.Terminal() {
		return rec
	}
	if th == nil || (rec != nil && (rec.ThreadID != th.ThreadID || rec.Tenant != th.Tenant)) {
		return rec
	}
	if last := th.LastRun; last != nil && last.RunID == runID && last.Status.Terminal() && sameCopy(rec, last.MsgSeq) {
		return EndedRun(rec, last)
	}
	l := th.Lease
	if l == nil || l.RunID != runID || !sameCopy(rec, l.MsgSeq) {
		return rec
	}
	var v Run
	if rec != nil {
		v = *rec
	} else {
		v = Run{RunID: runID, ThreadID: th.ThreadID, Tenant: th.Tenant, Agent: l.Agent, CreatedAt: l.AcquiredAt}
		if l.CreatedAt != nil {
			v.CreatedAt = *l.CreatedAt
		}
	}
	if v.Status == StatusRunning && v.Epoch > l.Epoch {
		return rec // a v1 record of a later attempt than this lease
	}
	started := l.AcquiredAt
	v.Status, v.StartedAt, v.Worker, v.Epoch = StatusRunning, &started, l.Worker, l.Epoch
	if l.Attempt > 0 {
		v.Attempt = l.Attempt
	} else if v.Attempt == 0 {
		v.Attempt = 1 // a lease written by a v1 worker, whose record is not written yet
	}
	if l.BaseCheckpoint != "" {
		v.BaseCheckpoint = l.BaseCheckpoint
	}
	if l.MsgSeq != 0 {
		v.MsgSeq = l.MsgSeq
	}
	return &v
}

// sameCopy reports whether a lease or summary for the request stored at
// seq belongs to the run of rec: a record names the request that owns
// its run once a worker saw it, and another copy's lease is not its run's.
func sameCopy(rec *Run, seq uint64) bool {
	return rec == nil || rec.MsgSeq == 0 || seq == 0 || rec.MsgSeq == seq
}

// EndedRun is the terminal record of a run: rec (its pending record, or a
// v1 running one; nil when it has none) with the terminal summary last,
// which the write releasing its thread carried, over it. What only the
// request knows (metadata, parent, webhook, strategy) comes from rec.
func EndedRun(rec, last *Run) *Run {
	v := *last
	if rec != nil {
		v.Metadata, v.Parent, v.Webhook = rec.Metadata, rec.Parent, rec.Webhook
		v.CancelRequested, v.FinishedEventID = false, rec.FinishedEventID
		if v.MultitaskStrategy == "" {
			v.MultitaskStrategy = rec.MultitaskStrategy
		}
		if v.CreatedAt.IsZero() {
			v.CreatedAt = rec.CreatedAt
		}
		if v.Agent == "" {
			v.Agent = rec.Agent
		}
	}
	return &v
}
