package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/natsagent/natsagent/internal/protocol"
)

func runApprove(ctx context.Context, args []string, std stdio) error {
	fs := newFlagSet("approve", "--thread <thread> [flags] [number…]", `
Answers a thread that waits for approval of tool calls. Without numbers every waiting call is
approved; with numbers (as --list and natsagent run show them, from 1) those are approved and the
others rejected, with --message as the reason. --decisions takes the whole answer as JSON, one
decision per call: [{"type":"approve"},{"type":"edit","arguments":{...}},{"type":"reject",
"message":"why"},{"type":"respond","message":"the result to use"}]. The resumed run is followed
like natsagent run.`, std)
	f := addResumeFlags(fs)
	list := fs.Bool("list", false, "only show the calls that wait, numbered")
	reason := fs.String("message", "", "why the calls not approved are rejected (with numbers)")
	raw := fs.String("decisions", "", "the decisions as a JSON array, one per waiting call")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return parseErr(err)
	}
	if err := f.requireThread(std, "approve"); err != nil {
		return err
	}
	picked, err := numbers(pos)
	if err != nil {
		return usageErr(std, "approve", "%v", err)
	}
	if *raw != "" && len(picked) > 0 {
		return usageErr(std, "approve", "give numbers or --decisions, not both")
	}
	c, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	w, err := c.pending(ctx, f.thread)
	if err != nil {
		return err
	}
	if w.open.Kind != protocol.InterruptApproval {
		return fmt.Errorf("thread %s waits for an answer to %q, not for an approval: answer it with natsagent answer --thread %s \"…\"", f.thread, w.open.Question, f.thread)
	}
	if *list {
		if f.json {
			return writeJSON(std.out, w.open)
		}
		fmt.Fprintf(std.out, "%s on thread %s wait for approval (run %s):\n", plural(len(w.open.ActionRequests), "tool call"), f.thread, w.open.RunID)
		writeActions(std.out, styleFor(std), &w.open)
		return nil
	}
	var decisions []protocol.Decision
	if *raw != "" {
		if err := json.Unmarshal([]byte(*raw), &decisions); err != nil {
			return fmt.Errorf("--decisions must be a JSON array of decisions: %v", err)
		}
	} else {
		for i := range w.open.ActionRequests {
			d := protocol.Decision{Type: protocol.DecisionApprove}
			if len(picked) > 0 && !picked[i+1] {
				d = protocol.Decision{Type: protocol.DecisionReject, Message: *reason}
			}
			decisions = append(decisions, d)
		}
		for n := range picked {
			if n > len(w.open.ActionRequests) {
				return fmt.Errorf("there is no call %d: %s wait (see natsagent approve --thread %s --list)", n, plural(len(w.open.ActionRequests), "call"), f.thread)
			}
		}
	}
	return decide(ctx, c, std, f, w, decisions)
}

// decide checks decisions against the interrupt, says what each does,
// and resumes the thread with them.
func decide(ctx context.Context, c *client, std stdio, f *resumeFlags, w *waiting, decisions []protocol.Decision) error {
	if err := protocol.CheckDecisions(&w.open, decisions); err != nil {
		return fmt.Errorf("%v (see the calls with natsagent approve --thread %s --list)", err, f.thread)
	}
	if !f.json {
		st := styleFor(std)
		for i, a := range w.open.ActionRequests {
			d := decisions[i]
			what := d.Type
			if d.Message != "" {
				what += ": " + oneLine(d.Message, 80)
			}
			fmt.Fprintf(std.err, "%d. %s(%s) → %s\n", i+1, st.cyan(a.Name), oneLine(a.Arguments, 80), what)
		}
	}
	return resume(ctx, c, std, f, w, protocol.Resume{Decisions: decisions})
}

// numbers reads call numbers given as "1 3" or "1,3".
func numbers(args []string) (map[int]bool, error) {
	out := make(map[int]bool)
	for _, a := range args {
		for _, p := range strings.Split(a, ",") {
			if p = strings.TrimSpace(p); p == "" {
				continue
			}
			n, err := strconv.Atoi(p)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("%q is not a call number (1, 2, …)", p)
			}
			out[n] = true
		}
	}
	return out, nil
}
