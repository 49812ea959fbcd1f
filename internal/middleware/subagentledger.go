package middleware

// The ledger of subagents in flight (DeerFlow DurableContext's delegation
// ledger). A lead run's children are derived from its own part of the
// transcript, which state keeps whole however a summary shortens the
// requests: each task or subagent_start call a guard did not refuse, and
// the last status the run saw of it (a started child is running; a
// result of task, subagent_await, subagent_status or subagent_cancel
// tells its status). Children whose last seen status is not terminal are
// listed in every request's trailing context (promptcontext.go), so a
// summary that cut their start never makes the lead forget them, start
// them again or answer before collecting them. Children are run-scoped:
// the worker cancels those still running when the run ends, so only this
// run's part is read. The ledger is extended call after call (Scratch),
// reading only the messages new since the last call.

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// MetaSubagentStatus is the status of a child as a delegation result
// left it (task: the child's status when the wait ended).
const MetaSubagentStatus = "subagent_status"

// LedgerChild is one child of a lead run as the ledger knows it.
type LedgerChild struct {
	RunID    string
	Subagent string
	Task     string
	// Status is the last status the run saw; "running" for a child
	// started and not heard of since.
	Status protocol.Status
}

// subagentLedger is a run's ledger, extended as the transcript grows.
type subagentLedger struct {
	mu       sync.Mutex
	st       *state.State
	rewrites uint64
	n        int
	// calls maps a delegation tool call id to its child's description,
	// and the other subagent tools' call ids to "".
	calls    map[string]LedgerChild
	children []LedgerChild
}

// RunningSubagents returns the children of the run whose last seen
// status is not terminal, in the order they were started.
func RunningSubagents(rt *Runtime, st *state.State) []LedgerChild {
	l := Scratch(rt, "subagents:ledger", func() *subagentLedger { return &subagentLedger{} })
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st != st || l.rewrites != st.Rewrites() || l.n > len(st.Messages) {
		l.st, l.rewrites, l.n = st, st.Rewrites(), runStart(st, rt.RunID)
		l.calls, l.children = nil, nil
	}
	for ; l.n < len(st.Messages); l.n++ {
		l.read(&st.Messages[l.n])
	}
	var out []LedgerChild
	for _, c := range l.children {
		if !c.Status.Terminal() {
			out = append(out, c)
		}
	}
	return out
}

// runStart is the index of the first message of run runID's part of the
// transcript (its tail).
func runStart(st *state.State, runID string) int {
	i := len(st.Messages)
	for i > 0 {
		if id, _ := st.Messages[i-1].Meta["run_id"].(string); id != runID && id != "" {
			break
		}
		i--
	}
	return i
}

func (l *subagentLedger) read(m *model.Message) {
	switch m.Role {
	case model.RoleAssistant:
		for _, c := range m.ToolCalls {
			switch {
			case isDelegation(c.Name):
				if l.calls == nil {
					l.calls = make(map[string]LedgerChild)
				}
				d, _ := parseDelegation(c.Arguments)
				l.calls[c.ID] = LedgerChild{Subagent: d.SubagentType, Task: clipText(oneLine(d.Description), 200)}
			case c.Name == SubagentStatusTool || c.Name == SubagentAwaitTool || c.Name == SubagentCancelTool:
				if l.calls == nil {
					l.calls = make(map[string]LedgerChild)
				}
				l.calls[c.ID] = LedgerChild{}
			}
		}
	case model.RoleTool:
		call, ok := l.calls[m.ToolCallID]
		if !ok || m.Meta[MetaBlockedBy] != nil {
			return
		}
		runID, status := resultStatus(m)
		if runID == "" || status == "" {
			return
		}
		for i := range l.children {
			if l.children[i].RunID == runID {
				l.children[i].Status = status
				return
			}
		}
		if call.Subagent == "" && call.Task == "" {
			return // a status of a child this run did not start: not its
		}
		call.RunID, call.Status = runID, status
		l.children = append(l.children, call)
	}
}

// resultStatus reads the child's run id and status off a subagent tool's
// result: the JSON of subagent_start, _status, _await, _cancel (and of a
// task handed to another worker), or task's text answer with its meta.
func resultStatus(m *model.Message) (string, protocol.Status) {
	runID, _ := m.Meta["subagent_run_id"].(string)
	var v struct {
		Status protocol.Status `json:"status"`
		RunID  string          `json:"run_id"`
	}
	if strings.HasPrefix(m.Content, "{") && json.Unmarshal([]byte(m.Content), &v) == nil && v.RunID != "" {
		switch v.Status {
		case "started", "existing":
			return v.RunID, protocol.StatusRunning
		case "busy":
			return "", ""
		}
		return v.RunID, v.Status
	}
	if runID == "" {
		return "", ""
	}
	if s, _ := m.Meta[MetaSubagentStatus].(string); s != "" {
		return runID, protocol.Status(s)
	}
	// A task answer from before the status was recorded: its text says
	// when the child still runs.
	if strings.Contains(m.Content, "The subagent is still running after") {
		return runID, protocol.StatusRunning
	}
	return runID, "ended"
}

// ledgerSection is the trailing-context section listing running children.
func ledgerSection(running []LedgerChild) string {
	if len(running) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("<subagents_running>\nSubagents you started in this run that have not finished as far as you have seen. Do not start them again. Collect each one's answer with subagent_await (or cancel it with subagent_cancel) before your final answer:")
	for _, c := range running {
		fmt.Fprintf(&b, "\n- run_id %s (%s, %s): %s", c.RunID, escapeMemory.Replace(c.Subagent), c.Status, escapeMemory.Replace(c.Task))
	}
	b.WriteString("\n</subagents_running>")
	return b.String()
}
