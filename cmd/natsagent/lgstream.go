package main

// --stream-mode: a run's events printed in LangGraph's stream modes, through
// the same translator the gateway streams them with (internal/langgraph),
// so what the CLI prints is what a LangGraph client of the gateway gets.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/natsagent/natsagent"
	"github.com/natsagent/natsagent/internal/langgraph"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// modesFlag is --stream-mode: LangGraph stream modes, repeated or
// separated by commas.
type modesFlag struct{ list []string }

func (m *modesFlag) String() string { return strings.Join(m.list, ",") }

func (m *modesFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			m.list = append(m.list, s)
		}
	}
	return nil
}

func addModesFlag(fs *flag.FlagSet) *modesFlag {
	m := &modesFlag{}
	fs.Var(m, "stream-mode", "print the run in LangGraph stream modes instead (values, updates, messages-tuple, messages, custom, events, debug, tasks, checkpoints, tools; repeated or comma-separated): one SSE event per part as the gateway streams it, one {\"event\",\"data\"} line each with --json")
	return m
}

// modes returns the modes asked for; ok is false without --stream-mode
// (or with natsagent's own, which the usual rendering prints).
func (m *modesFlag) modes() (modes langgraph.Modes, ok bool, err error) {
	if m == nil || len(m.list) == 0 {
		return langgraph.Modes{}, false, nil
	}
	if modes, err = langgraph.ParseModes(m.list, false); err != nil {
		return modes, false, fmt.Errorf("--stream-mode: %w", err)
	}
	return modes, !modes.Native(), nil
}

// followModes prints a run's events from fd translated to modes until its
// end; the exit status is the run's, as for follow.
func followModes(ctx context.Context, c *client, std stdio, f *clientFlags, fd *natsagent.Events, rec *protocol.Run, modes langgraph.Modes, input []model.Message) error {
	src := &storeSource{c: c, thread: rec.ThreadID, run: rec.RunID, input: input}
	tr := langgraph.NewStream(modes, langgraph.Run{RunID: rec.RunID, ThreadID: rec.ThreadID, Agent: rec.Agent, Attempt: rec.Attempt}, src, protocol.InterruptValue)
	write := func(parts []langgraph.Part) error {
		for _, p := range parts {
			var err error
			if f.json {
				var line []byte
				if line, err = json.Marshal(struct {
					Event string          `json:"event"`
					Data  json.RawMessage `json:"data"`
				}{p.Event, p.Data}); err == nil {
					_, err = fmt.Fprintf(std.out, "%s\n", line)
				}
			} else {
				_, err = fmt.Fprintf(std.out, "event: %s\ndata: %s\n\n", p.Event, p.Data)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	if err := write(tr.Open()); err != nil {
		return err
	}
	var ended *natsagent.Event
	for {
		ev, err := nextWithin(ctx, fd, idleCheck)
		var data []byte
		switch {
		case ctx.Err() != nil:
			fmt.Fprintf(std.err, "detached: run %s goes on. Follow it again: natsagent tail --run %s%s\n", rec.RunID, rec.RunID, tenantFlag(c))
			return nil
		case errors.Is(err, context.DeadlineExceeded):
			// A run whose events expired, or whose worker died before its
			// run.finished: its record ends the stream, once the feed
			// stayed silent another idleCheck after the record was seen
			// ended (as followRun does: events can trail the record).
			if ended == nil {
				if ended, err = c.endedRecord(ctx, rec.ThreadID, rec.RunID); err != nil {
					return err
				}
				continue
			}
			data = ended.Raw()
		case err != nil:
			return fmt.Errorf("lost the run's events: %w; follow it again with `natsagent tail --run %s --stream-mode %s`", err, rec.RunID, strings.Join(modes.List(), ","))
		default:
			data = ev.Raw()
		}
		parts, err := tr.Next(ctx, langgraph.Native{Data: data})
		if err != nil {
			fmt.Fprintf(std.err, "warning: the thread's state was not read (%v): values lack what the events do not say\n", err)
		}
		if err := write(parts); err != nil {
			return err
		}
		if tr.Done() {
			var env struct {
				Data protocol.FinishedData `json:"data"`
			}
			if err := json.Unmarshal(data, &env); err != nil {
				return err
			}
			return exitErr(rec.RunID, &env.Data)
		}
	}
}

// storeSource reads the thread states a translation needs from the
// thread's checkpoints on its current chain: where the run started, and
// its last checkpoint.
type storeSource struct {
	c           *client
	thread, run string
	// input is the run's input when this command submitted it.
	input []model.Message
}

// chain is the thread's checkpoints from its first to its head.
func (s *storeSource) chain(ctx context.Context) ([]*natsagent.Checkpoint, error) {
	chain, err := s.c.api.Checkpoints(ctx, s.thread)
	if errors.Is(err, natsagent.ErrNotFound) {
		return nil, nil
	}
	return chain, err
}

// Start is the state the run's attempt began with: its base checkpoint
// with its input (a later attempt: its newest checkpoint saved before t).
func (s *storeSource) Start(ctx context.Context, attempt int, t time.Time) (*state.State, error) {
	st := &state.State{}
	rec, err := s.c.api.RunOf(ctx, s.thread, s.run)
	if err != nil {
		st.Apply(state.Update{Messages: s.input})
		return st, err
	}
	chain, err := s.chain(ctx)
	if err != nil {
		st.Apply(state.Update{Messages: s.input})
		return st, err
	}
	base, at := -1, -1
	for i, d := range chain {
		if d.ID == rec.BaseCheckpoint {
			base, at = i, i
		}
		if attempt > 1 && d.RunID == s.run && !d.Time.After(t) {
			at = i
		}
	}
	for _, d := range chain[:at+1] {
		st.Apply(d.Update)
	}
	if at == base {
		in := s.input
		for _, d := range chain[base+1:] {
			if d.RunID == s.run {
				in = nil
				for _, m := range d.Update.Messages {
					if m.Role == model.RoleUser {
						in = append(in, m)
					}
				}
				break
			}
		}
		st.Apply(state.Update{Messages: in})
	}
	return st, nil
}

// Final is the state at the run's last checkpoint (the head when it has
// none).
func (s *storeSource) Final(ctx context.Context) (*state.State, error) {
	chain, err := s.chain(ctx)
	if err != nil {
		return nil, err
	}
	end := len(chain) - 1
	for i, d := range chain {
		if d.RunID == s.run {
			end = i
		}
	}
	st := &state.State{}
	for _, d := range chain[:end+1] {
		st.Apply(d.Update)
	}
	return st, nil
}
