package middleware

// Loop detection. Boundary: model response (after-model) and model call
// (request-only warnings). Reads the thread's transcript; writes only the
// stripped assistant message of a hard stop; emits loop.detected (custom).
// Two layers after DeerFlow, and a third of ours: identical tool-call sets
// (order-insensitive, keyed by each tool's salient arguments) within the
// last 20 tool-calling messages warn at 3 and stop at 5; calls of one tool
// within the last 50 calls warn at 30 and stop at 50, with per-tool
// overrides; a cycle of 2 to 4 tool-calling messages (search, fetch,
// search, fetch... with arguments that all differ: deer-flow #2569, which
// the first two never catch) warns at 15 rounds and stops at 25. The history is
// derived from the run's part of the transcript, so it is the same on every
// worker and after a redelivery. Unlike DeerFlow's thread-wide history, it
// is scoped to the run: a person asking the same thing in five turns is
// not a loop. A warning goes into the next request only, as a
// trailing user message; a stop strips the tool calls from the assistant
// message and ends the run with stop_reason loop_capped. A whole batch is
// accounted before deciding, so a warning never hides a stop later in it.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
)

// LoopDetection stops runs that repeat themselves.
type LoopDetection struct {
	WarnThreshold int                  `json:"warn_threshold"`
	HardLimit     int                  `json:"hard_limit"`
	WindowSize    int                  `json:"window_size"`
	ToolFreqWarn  int                  `json:"tool_freq_warn"`
	ToolFreqHard  int                  `json:"tool_freq_hard_limit"`
	Overrides     map[string]FreqLimit `json:"tool_freq_overrides"`
	// CycleWarn and CycleHard are the repetitions of a cycle of tool
	// calls (CycleMaxPeriod tool-calling messages at most, of two tools
	// or more) at which the cycle layer warns and stops.
	CycleWarn      int `json:"cycle_warn"`
	CycleHard      int `json:"cycle_hard_limit"`
	CycleMaxPeriod int `json:"cycle_max_period"`
}

// FreqLimit overrides the per-tool thresholds of one tool.
type FreqLimit struct {
	Warn int `json:"warn"`
	Hard int `json:"hard_limit"`
}

// NewLoopDetection fills defaults and checks the thresholds.
func NewLoopDetection(l LoopDetection) (*LoopDetection, error) {
	if l.WarnThreshold == 0 {
		l.WarnThreshold = 3
	}
	if l.HardLimit == 0 {
		l.HardLimit = 5
	}
	if l.WindowSize == 0 {
		l.WindowSize = 20
	}
	if l.ToolFreqWarn == 0 {
		l.ToolFreqWarn = 30
	}
	if l.ToolFreqHard == 0 {
		l.ToolFreqHard = 50
	}
	if l.CycleWarn == 0 {
		l.CycleWarn = 15
	}
	if l.CycleHard == 0 {
		l.CycleHard = 25
	}
	if l.CycleMaxPeriod == 0 {
		l.CycleMaxPeriod = 4
	}
	switch {
	case l.CycleWarn < 2:
		return nil, fmt.Errorf("cycle_warn must be at least 2")
	case l.CycleHard < l.CycleWarn:
		return nil, fmt.Errorf("cycle_hard_limit (%d) must be at least cycle_warn (%d)", l.CycleHard, l.CycleWarn)
	case l.CycleMaxPeriod < 2 || l.CycleMaxPeriod > 10:
		return nil, fmt.Errorf("cycle_max_period must be 2 to 10, not %d", l.CycleMaxPeriod)
	case l.WarnThreshold < 1:
		return nil, fmt.Errorf("warn_threshold must be at least 1")
	case l.HardLimit < l.WarnThreshold:
		return nil, fmt.Errorf("hard_limit (%d) must be at least warn_threshold (%d)", l.HardLimit, l.WarnThreshold)
	case l.WindowSize < l.HardLimit:
		return nil, fmt.Errorf("window_size (%d) must be at least hard_limit (%d)", l.WindowSize, l.HardLimit)
	case l.ToolFreqHard < l.ToolFreqWarn:
		return nil, fmt.Errorf("tool_freq_hard_limit (%d) must be at least tool_freq_warn (%d)", l.ToolFreqHard, l.ToolFreqWarn)
	}
	for tool, o := range l.Overrides {
		if o.Warn < 1 || o.Hard < o.Warn {
			return nil, fmt.Errorf("tool_freq_overrides.%s: need 1 <= warn <= hard_limit, got warn %d, hard_limit %d", tool, o.Warn, o.Hard)
		}
	}
	return &l, nil
}

// Name implements Middleware.
func (*LoopDetection) Name() string { return "loop_detection" }

const loopWarningName = "loop_warning"

// EventLoopDetected is emitted when the detector warns or stops.
const EventLoopDetected = protocol.EventLoopDetected

// AfterModel implements AfterModel.
func (l *LoopDetection) AfterModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	i := LastAssistant(st)
	if i < 0 || i != len(st.Messages)-1 || len(st.Messages[i].ToolCalls) == 0 {
		return Result{}, nil
	}
	current := st.Messages[i].ToolCalls

	// Layer 1: identical call sets among the last WindowSize tool-calling
	// messages (this one included).
	hash := CallSetHash(current)
	same := 0
	seenMsgs := 0
	// Layer 2: calls per tool among the last freqWindow calls.
	freqWindow := max(l.WindowSize, l.ToolFreqHard)
	for _, o := range l.Overrides {
		freqWindow = max(freqWindow, o.Hard)
	}
	freq := make(map[string]int)
	seenCalls := 0
	for j := i; j >= 0 && (seenMsgs < l.WindowSize || seenCalls < freqWindow); j-- {
		m := st.Messages[j]
		if id, _ := m.Meta["run_id"].(string); id != rt.RunID && id != "" {
			break // an earlier run's turn
		}
		if m.Role != model.RoleAssistant || len(m.ToolCalls) == 0 {
			continue
		}
		if seenMsgs < l.WindowSize {
			seenMsgs++
			if CallSetHash(m.ToolCalls) == hash {
				same++
			}
		}
		for k := len(m.ToolCalls) - 1; k >= 0 && seenCalls < freqWindow; k-- {
			freq[m.ToolCalls[k].Name]++
			seenCalls++
		}
	}
	inBatch := make(map[string]int)
	for _, c := range current {
		inBatch[c.Name]++
	}

	var warnings []string
	if same >= l.HardLimit {
		return l.stop(rt, st, i, "[FORCED STOP] The same tool calls were repeated too many times. Here is the answer with the results collected so far.", "identical_calls", "")
	}
	if same == l.WarnThreshold {
		warnings = append(warnings, "[LOOP DETECTED] You are repeating the same tool calls. Stop calling tools and give your final answer now; if you cannot finish the task, say what you accomplished and what is missing.")
	}
	names := make([]string, 0, len(inBatch))
	for name := range inBatch {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		warn, hard := l.ToolFreqWarn, l.ToolFreqHard
		if o, ok := l.Overrides[name]; ok {
			warn, hard = o.Warn, o.Hard
		}
		n := freq[name]
		if n >= hard {
			return l.stop(rt, st, i, fmt.Sprintf("[FORCED STOP] The tool %s was called %d times, over the safety limit. Here is the answer with the results collected so far.", name, n), "tool_frequency", name)
		}
		if n >= warn && n-inBatch[name] < warn {
			warnings = append(warnings, fmt.Sprintf("[LOOP DETECTED] You have called %s %d times without giving a final answer. Use the results you already have and answer; call it again only if it is truly necessary.", name, n))
		}
	}
	// Layer 3: a cycle of tool calls (search, fetch, search, fetch...)
	// whose arguments all differ, which neither layer above sees.
	if c := l.cycle(rt, st, i); c.reps >= l.CycleHard {
		return l.stop(rt, st, i, fmt.Sprintf("[FORCED STOP] The cycle of tool calls %s was repeated %d times, over the safety limit. Here is the answer with the results collected so far.", c.names, c.reps), "cycle", c.names)
	} else if c.reps == l.CycleWarn && c.fresh {
		warnings = append(warnings, fmt.Sprintf("[LOOP DETECTED] You have repeated the cycle of tool calls %s %d times without giving a final answer. Use the results you already have and answer; continue only if each new call is truly necessary.", c.names, c.reps))
	}
	for _, w := range warnings {
		queueGuidance(rt, loopWarningName, w)
	}
	if len(warnings) > 0 && rt.Emit != nil {
		rt.Emit(EventLoopDetected, map[string]any{"action": "warn", "warnings": warnings})
	}
	return Result{}, nil
}

// cycleFound is the cycle the run's latest tool-calling messages repeat.
type cycleFound struct {
	// names are the tools of one round, in call order ("search → fetch").
	names string
	// reps counts the complete rounds at the end of the transcript.
	reps int
	// fresh is true when the latest message completed a round.
	fresh bool
}

// cycle finds the shortest cycle of 2 to CycleMaxPeriod tool-calling
// messages that the run's latest ones repeat, each message told by the
// sorted names of its calls (arguments ignored: they differ from round to
// round). A round of one message is layer 2's, not a cycle; a cycle whose
// every tool has a tool_freq_overrides entry is the batch work the
// overrides allow, not a loop.
func (l *LoopDetection) cycle(rt *Runtime, st *state.State, i int) cycleFound {
	need := l.CycleMaxPeriod * (l.CycleHard + 1)
	sigs := make([]string, 0, 16)
	for j := i; j >= 0 && len(sigs) < need; j-- {
		m := &st.Messages[j]
		if id, _ := m.Meta["run_id"].(string); id != rt.RunID && id != "" {
			break
		}
		if m.Role != model.RoleAssistant || len(m.ToolCalls) == 0 {
			continue
		}
		names := make([]string, len(m.ToolCalls))
		for k, c := range m.ToolCalls {
			names[k] = c.Name
		}
		sort.Strings(names)
		sigs = append(sigs, strings.Join(names, "+"))
	}
	// sigs[0] is the latest message.
	for p := 2; p <= l.CycleMaxPeriod && 2*p <= len(sigs); p++ {
		if !primitive(sigs[:p]) {
			continue
		}
		n := p
		for n < len(sigs) && sigs[n] == sigs[n%p] {
			n++
		}
		if n < 2*p {
			continue
		}
		round := make([]string, p)
		exempt := true
		for k := range p {
			round[k] = sigs[p-1-k]
			for _, name := range strings.Split(round[k], "+") {
				if _, ok := l.Overrides[name]; !ok {
					exempt = false
				}
			}
		}
		if exempt {
			return cycleFound{}
		}
		return cycleFound{names: strings.Join(round, " → "), reps: n / p, fresh: n%p == 0}
	}
	return cycleFound{}
}

// primitive reports whether block is no repetition of a shorter block
// (a, b is; a, a and a, b, a, b are not).
func primitive(block []string) bool {
	for d := 1; d < len(block); d++ {
		if len(block)%d != 0 {
			continue
		}
		rep := true
		for k := d; k < len(block); k++ {
			if block[k] != block[k%d] {
				rep = false
				break
			}
		}
		if rep {
			return false
		}
	}
	return true
}

func (l *LoopDetection) stop(rt *Runtime, st *state.State, i int, note, layer, tool string) (Result, error) {
	if rt.Emit != nil {
		rt.Emit(EventLoopDetected, map[string]any{"action": "stop", "layer": layer, "tool": tool, "message_id": st.Messages[i].ID})
	}
	return stopWith(st, i, protocol.StopLoopCapped, note), nil
}

// WrapModelCall implements WrapModelCall: it delivers queued warnings.
func (l *LoopDetection) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	resp, err := next(ctx, withGuidance(rt, loopWarningName, req))
	if err == nil {
		clearGuidance(rt, loopWarningName)
	}
	return resp, err
}

// salientArgs are the arguments that identify what a call does.
var salientArgs = []string{"path", "url", "query", "command", "pattern", "glob", "cmd"}

// CallSetHash identifies a set of tool calls regardless of their order: two
// messages asking for the same things hash alike.
func CallSetHash(calls []model.ToolCall) string {
	keys := make([]string, len(calls))
	for i, c := range calls {
		keys[i] = c.Name + ":" + callKey(c)
	}
	sort.Strings(keys)
	sum := sha256.Sum256([]byte(strings.Join(keys, "\x00")))
	return hex.EncodeToString(sum[:6])
}

func callKey(c model.ToolCall) string {
	var args map[string]any
	if json.Unmarshal([]byte(c.Arguments), &args) != nil {
		return strings.TrimSpace(c.Arguments)
	}
	switch c.Name {
	case "read_file":
		// Reads of nearby line ranges of one file count as the same call:
		// lines are bucketed by 200.
		start := intArg(args, 1, "offset", "start_line")
		if start < 1 {
			start = 1
		}
		end := start
		if n := intArg(args, 0, "limit"); n > 0 {
			end = start + n - 1
		}
		if e := intArg(args, 0, "end_line"); e > 0 {
			end = e
		}
		lo, hi := (start-1)/200, (end-1)/200
		if lo > hi {
			lo, hi = hi, lo
		}
		return fmt.Sprintf("%v:%d-%d", args["path"], lo, hi)
	case "write_file", "edit_file", "str_replace":
		return canonical(args)
	}
	salient := make(map[string]any)
	for _, k := range salientArgs {
		if v, ok := args[k]; ok {
			salient[k] = v
		}
	}
	if len(salient) == 0 {
		return canonical(args)
	}
	return canonical(salient)
}

func intArg(args map[string]any, def int, names ...string) int {
	for _, n := range names {
		if f, ok := args[n].(float64); ok {
			return int(f)
		}
	}
	return def
}

// canonical encodes v with sorted keys (encoding/json sorts map keys).
func canonical(v map[string]any) string {
	data, _ := json.Marshal(v)
	return string(data)
}
