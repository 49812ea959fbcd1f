package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"

	"github.com/natsagent/natsagent/internal/protocol"
)

// resumeFlags are the flags of approve, reject and answer.
type resumeFlags struct {
	*runFlags
	thread string
}

func addResumeFlags(fs *flag.FlagSet) *resumeFlags {
	f := &resumeFlags{runFlags: addRunFlags(fs)}
	fs.StringVar(&f.thread, "thread", "", "the thread that waits (required)")
	return f
}

// waiting is what an interrupted thread waits for.
type waiting struct {
	thread *protocol.Thread
	open   protocol.Interrupt
}

// pending reads what a thread waits for from its head checkpoint, as the
// gateway's resume check does: the checkpoint, not the run record, is
// what the worker resumes from.
func (c *client) pending(ctx context.Context, thread string) (*waiting, error) {
	th, err := c.thread(ctx, thread)
	if err != nil {
		return nil, err
	}
	st, err := c.api.State(ctx, thread)
	if err != nil {
		return nil, fmt.Errorf("read thread %s's state: %w", thread, err)
	}
	w := &waiting{thread: th}
	if ok, err := st.Value(protocol.InterruptValue, &w.open); err != nil || !ok || w.open.Kind == "" {
		status := th.Status
		if status == "" {
			status = protocol.ThreadIdle
		}
		return nil, fmt.Errorf("thread %s is not waiting for a person (it is %s): there is nothing to approve, reject or answer; send a new message with natsagent run --thread %s", thread, status, thread)
	}
	if th.Lease != nil && th.Lease.RunID != w.open.RunID {
		// A run holds the thread: an answer already sent, or new input,
		// is about to change what it waits for.
		return nil, fmt.Errorf("thread %s is busy with run %s, which may answer what it waits for; follow it with natsagent tail --run %s, then try again", thread, th.Lease.RunID, th.Lease.RunID)
	}
	return w, nil
}

// resume submits the run that answers w and follows it like natsagent
// run. The new run uses the interrupted run's agent.
func resume(ctx context.Context, c *client, std stdio, f *resumeFlags, w *waiting, answer protocol.Resume) error {
	raw, err := json.Marshal(answer)
	if err != nil {
		return err
	}
	req := &protocol.RunRequest{ThreadID: w.thread.ThreadID, Command: &protocol.Command{Resume: raw}}
	if rec, err := c.api.RunOf(ctx, w.thread.ThreadID, w.open.RunID); err == nil {
		req.Agent = rec.Agent
	}
	return launch(ctx, c, std, f.runFlags, req)
}

// requireThread checks --thread was given.
func (f *resumeFlags) requireThread(std stdio, name string) error {
	if f.thread == "" {
		return usageErr(std, name, "name the waiting thread with --thread")
	}
	return nil
}
