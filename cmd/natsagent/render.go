package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// renderer prints run events as they arrive: the answer as it streams,
// each tool call as a line (`▸ name(args)`) with its result status under
// it, notes for retries, guards and takeovers, and a final line per run.
// With asJSON it prints each event's envelope as received, one per line.
//
// Per run it applies the protocol's acceptance rule (docs/protocol.md
// 2.10.5): an event counts if its seq is above the last one counted, or
// fills a seq skipped before (an event sent again after a node loss
// arrives late; a late delta does not count, message.completed carries
// the whole text), and its attempt is not older than the newest
// run.started; nothing counts after the first run.finished.
type renderer struct {
	w      io.Writer
	st     style
	asJSON bool
	// thread shows which run each event belongs to (tail of a thread).
	thread bool

	runs    map[string]*runView
	lastRun string // run of the last event printed
	lastMsg string // message whose deltas are being printed
	midLine bool   // the cursor is not at the start of a line
}

// runView is what the renderer remembers of one run.
type runView struct {
	seq      uint64
	attempt  int
	finished bool
	started  time.Time
	tools    int
	in, out  int
	approx   bool
	printed  map[string]bool // messages whose text is on screen
	// partial holds the text of the deltas printed of a message not
	// completed yet: its message.completed prints what they missed.
	partial map[string]string
	// skipped holds seqs jumped over since the first event seen, which a
	// late event may still fill (at most maxSkipped).
	skipped map[uint64]bool
}

// maxSkipped bounds the skipped seqs a run view remembers.
const maxSkipped = 256

func newRenderer(w io.Writer, st style, asJSON, thread bool) *renderer {
	return &renderer{w: w, st: st, asJSON: asJSON, thread: thread, runs: make(map[string]*runView)}
}

// event handles one event's JSON and returns run.finished's data when the
// event is the run's (accepted) end.
func (r *renderer) event(raw []byte) *protocol.FinishedData {
	var ev protocol.Event
	if err := json.Unmarshal(raw, &ev); err != nil {
		if r.asJSON {
			return nil
		}
		r.line(r.st.dim("· an event that is not JSON was skipped: " + err.Error()))
		return nil
	}
	v := r.runs[ev.RunID]
	if v == nil {
		v = &runView{printed: make(map[string]bool)}
		r.runs[ev.RunID] = v
	}
	// run.finished is stored once (its message id), so it ends the run
	// whatever its seq: a request dead-lettered after its run.queued
	// finishes with seq 1 as well.
	last := ev.Type == protocol.EventRunFinished
	late := ev.Seq < v.seq && v.skipped[ev.Seq] && ev.Type != protocol.EventMessageDelta
	// A live event has no seq: the follow (events.Follow) placed it.
	repeated := !ev.Live && ev.Seq <= v.seq && !late
	if v.finished || !last && (repeated || ev.Attempt != 0 && ev.Attempt < v.attempt) {
		return nil
	}
	switch {
	case ev.Live:
	case late:
		delete(v.skipped, ev.Seq)
	case ev.Seq > v.seq:
		if v.seq > 0 {
			for s := v.seq + 1; s < ev.Seq && len(v.skipped) < maxSkipped; s++ {
				if v.skipped == nil {
					v.skipped = make(map[uint64]bool)
				}
				v.skipped[s] = true
			}
		}
		v.seq = ev.Seq
	}
	if ev.Type == protocol.EventRunStarted && ev.Attempt > v.attempt {
		v.attempt = ev.Attempt
	}
	var fin *protocol.FinishedData
	if last {
		v.finished = true
		fin = &protocol.FinishedData{}
		if err := json.Unmarshal(ev.Data, fin); err != nil {
			fin.Status = protocol.StatusError
			fin.Error = "run.finished carried unreadable data: " + err.Error()
		}
	}
	if r.asJSON {
		r.w.Write(append(append([]byte(nil), raw...), '\n'))
		r.lastRun = ev.RunID
		return fin
	}
	if r.thread && ev.RunID != r.lastRun {
		r.endLine()
		head := "── run " + ev.RunID
		if ev.Type == protocol.EventRunQueued {
			var d protocol.QueuedData
			_ = json.Unmarshal(ev.Data, &d)
			head += fmt.Sprintf(" queued (agent %s, %s)", d.Agent, d.MultitaskStrategy)
		}
		r.line(r.st.dim(head))
		r.lastMsg = ""
	}
	r.lastRun = ev.RunID
	r.show(&ev, v, fin)
	return fin
}

func (r *renderer) show(ev *protocol.Event, v *runView, fin *protocol.FinishedData) {
	switch ev.Type {
	case protocol.EventRunQueued, protocol.EventApprovalRequested:
		// The final line shows what an interrupt waits for.
	case protocol.EventRunStarted:
		var d protocol.StartedData
		_ = json.Unmarshal(ev.Data, &d)
		if v.started.IsZero() {
			v.started = ev.Time
		}
		if d.Attempt > 1 {
			r.endLine()
			r.line(r.st.yellow(fmt.Sprintf("↻ attempt %d on worker %s: the run goes on from its last checkpoint; text after the last tool call may repeat", d.Attempt, d.Worker)))
		}
	case protocol.EventMessageDelta:
		var d protocol.DeltaData
		if json.Unmarshal(ev.Data, &d) != nil || d.Delta == "" {
			return
		}
		if d.MessageID != r.lastMsg {
			r.endLine()
			r.lastMsg = d.MessageID
		}
		io.WriteString(r.w, d.Delta)
		r.midLine = !strings.HasSuffix(d.Delta, "\n")
		v.printed[d.MessageID] = true
		if v.partial == nil {
			v.partial = make(map[string]string)
		}
		v.partial[d.MessageID] += d.Delta
	case protocol.EventMessageCompleted:
		var m model.Message
		if json.Unmarshal(ev.Data, &m) != nil {
			return
		}
		shown, streamed := v.partial[m.ID]
		delete(v.partial, m.ID)
		switch {
		case strings.TrimSpace(m.Content) == "":
		case !v.printed[m.ID]:
			r.endLine()
			r.line(m.Content)
		case streamed && shown != m.Content && strings.HasPrefix(m.Content, shown) && r.lastMsg == m.ID:
			// Live deltas were missed at the end (a reconnect, a
			// slow reader): the message's rest.
			io.WriteString(r.w, m.Content[len(shown):])
			r.midLine = !strings.HasSuffix(m.Content, "\n")
		case streamed && shown != m.Content:
			// Some were missed in between: the whole message again.
			r.endLine()
			r.line(r.st.dim("(the whole message, some of its text was missed:)"))
			r.line(m.Content)
		}
		v.printed[m.ID] = true
		r.endLine()
		r.lastMsg = ""
		// Protocol v2: the call's usage rides on its message (meta.usage
		// with step); a v1 run sent it apart as usage.model, below.
		if u, ok := m.Meta["usage"].(map[string]any); ok && u["step"] != nil {
			in, _ := u["input_tokens"].(float64)
			out, _ := u["output_tokens"].(float64)
			approx, _ := u["approximate"].(bool)
			v.in += int(in)
			v.out += int(out)
			v.approx = v.approx || approx
		}
	case protocol.EventToolStarted:
		var d protocol.ToolEventData
		_ = json.Unmarshal(ev.Data, &d)
		v.tools++
		r.endLine()
		r.line(r.st.cyan("▸ "+d.Name) + "(" + oneLine(d.Arguments, 100) + ")")
	case protocol.EventToolFinished:
		var d protocol.ToolEventData
		_ = json.Unmarshal(ev.Data, &d)
		r.endLine()
		if d.Status == model.ToolStatusError {
			r.line("  " + r.st.red("✗ error") + " " + r.st.dim(oneLine(d.Result, 100)))
		} else {
			r.line("  " + r.st.green("✓ "+orDefault(d.Status, "done")) + " " + r.st.dim(oneLine(d.Result, 80)))
		}
	case protocol.EventUsageModel: // protocol v1 runs
		var d protocol.UsageModelData
		if json.Unmarshal(ev.Data, &d) == nil {
			v.in += d.InputTokens
			v.out += d.OutputTokens
			v.approx = v.approx || d.Approximate
		}
	case protocol.EventModelRetry:
		var d struct {
			Kind      string `json:"kind"`
			Error     string `json:"error"`
			MessageID string `json:"message_id"`
		}
		_ = json.Unmarshal(ev.Data, &d)
		r.endLine()
		note := fmt.Sprintf("↻ model retry (%s): %s", d.Kind, oneLine(d.Error, 120))
		if d.MessageID != "" && v.printed[d.MessageID] {
			note += "; the answer starts again"
			delete(v.printed, d.MessageID)
			r.lastMsg = ""
		}
		r.line(r.st.yellow(note))
	case protocol.EventThreadTitled:
		var d struct {
			Title string `json:"title"`
		}
		_ = json.Unmarshal(ev.Data, &d)
		if r.thread {
			r.endLine()
			r.line(r.st.dim("· title: " + d.Title))
		}
	case protocol.EventTodos:
		var d struct {
			Todos []struct {
				Content string `json:"content"`
				Status  string `json:"status"`
			} `json:"todos"`
		}
		_ = json.Unmarshal(ev.Data, &d)
		r.endLine()
		r.line(r.st.dim("· todos:"))
		for _, t := range d.Todos {
			mark := "[ ]"
			switch t.Status {
			case "completed":
				mark = "[x]"
			case "in_progress":
				mark = "[~]"
			}
			r.line(r.st.dim("    " + mark + " " + oneLine(t.Content, 100)))
		}
	case protocol.EventLoopDetected, protocol.EventBudgetWarning, protocol.EventBudgetExceeded, protocol.EventSafetyStopped:
		r.endLine()
		r.line(r.st.yellow("! " + ev.Type + " " + oneLine(string(ev.Data), 160)))
	case protocol.EventRunFinished:
		r.finished(ev, v, fin)
	default:
		r.endLine()
		r.line(r.st.dim("· " + ev.Type + " " + oneLine(string(ev.Data), 120)))
	}
}

// finished prints a run's final line: status, stop reason, and what the
// run did; an interrupt is followed by what to answer and how.
func (r *renderer) finished(ev *protocol.Event, v *runView, fin *protocol.FinishedData) {
	r.endLine()
	if out := fin.Output; out != nil && strings.TrimSpace(out.Content) != "" && !v.printed[out.ID] {
		// The answer's events were not read (expired, or the tail
		// started after them): the record's output stands in.
		r.line(out.Content)
	}
	head := r.st.status(fin.Status)
	if fin.Error != "" {
		head += ": " + fin.Error
	}
	parts := []string{r.st.bold("■ ") + head}
	if fin.StopReason != "" {
		parts = append(parts, "stop reason "+fin.StopReason)
	}
	if fin.SupersededBy != "" {
		parts = append(parts, "superseded by run "+fin.SupersededBy)
	}
	parts = append(parts, "run "+ev.RunID)
	if !v.started.IsZero() && ev.Time.After(v.started) {
		parts = append(parts, roundDuration(ev.Time.Sub(v.started)))
	}
	if v.tools > 0 {
		parts = append(parts, plural(v.tools, "tool call"))
	}
	if v.in+v.out > 0 {
		approx := ""
		if v.approx {
			approx = "~"
		}
		parts = append(parts, fmt.Sprintf("tokens %s%s in / %s out", approx, count(v.in), count(v.out)))
	}
	r.line(strings.Join(parts, " · "))
	if fin.Interrupt != nil {
		r.interrupt(ev.Tenant, ev.ThreadID, fin.Interrupt)
	}
}

// interrupt shows what a person must answer and the commands that do it.
func (r *renderer) interrupt(tenant, thread string, in *protocol.Interrupt) {
	where := "--thread " + thread
	if tenant != protocol.DefaultTenant {
		where += " --tenant " + tenant
	}
	switch in.Kind {
	case protocol.InterruptApproval:
		r.line(r.st.yellow(fmt.Sprintf("? %s wait for approval:", plural(len(in.ActionRequests), "tool call"))))
		writeActions(r.w, r.st, in)
		r.line(r.st.dim(fmt.Sprintf("  approve: natsagent approve %s [number…]   reject: natsagent reject %s --message \"why\"", where, where)))
	case protocol.InterruptClarification:
		q := "? " + in.Question
		if len(in.Options) > 0 {
			q += " (options: " + strings.Join(in.Options, ", ") + ")"
		}
		r.line(r.st.yellow(q))
		r.line(r.st.dim(fmt.Sprintf("  answer: natsagent answer %s \"your answer\"", where)))
	}
}

// writeActions lists the tool calls of an approval, numbered from 1 as
// approve takes them.
func writeActions(w io.Writer, st style, in *protocol.Interrupt) {
	for i, a := range in.ActionRequests {
		fmt.Fprintf(w, "  %d. %s(%s)\n", i+1, st.cyan(a.Name), oneLine(a.Arguments, 200))
	}
}

func (r *renderer) line(s string) {
	io.WriteString(r.w, s+"\n")
	r.midLine = false
}

// endLine ends a line of streamed text, so what follows starts on its own.
func (r *renderer) endLine() {
	if r.midLine {
		io.WriteString(r.w, "\n")
		r.midLine = false
	}
}

// errIncomplete marks a run a guard cut short (status incomplete): the
// command exits 3, so a script tells a cut answer from a failure (1).
var errIncomplete = errors.New("the answer is incomplete")

// exitErr is the error a follower returns for how a run ended, so the
// exit status is not 0: nil for an end that lets the thread go on
// (success, interrupted, steered).
func exitErr(run string, fin *protocol.FinishedData) error {
	switch fin.Status {
	case protocol.StatusIncomplete:
		return fmt.Errorf("run %s ended incomplete (%s): %w", run, fin.StopReason, errIncomplete)
	case protocol.StatusError, protocol.StatusCancelled, protocol.StatusTimeout, protocol.StatusRejected:
		if fin.Error != "" {
			return fmt.Errorf("run %s ended %s: %s", run, fin.Status, fin.Error)
		}
		return fmt.Errorf("run %s ended %s", run, fin.Status)
	}
	return nil
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
