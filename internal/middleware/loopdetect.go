package middleware

// Loop detection. Boundary: model response (after-model) and model call
// (request-only warnings). Reads the thread's transcript; writes only the
// stripped assistant message of a hard stop; emits loop.detected (custom).
// Two layers, after DeerFlow: identical tool-call sets (order-insensitive,
// keyed by each tool's salient arguments) within the last 20 tool-calling
// messages warn at 3 and stop at 5; calls of one tool within the last 50
// calls warn at 30 and stop at 50, with per-tool overrides. The history is
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
	switch {
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
	for _, w := range warnings {
		queueGuidance(rt, loopWarningName, w)
	}
	if len(warnings) > 0 && rt.Emit != nil {
		rt.Emit(EventLoopDetected, map[string]any{"action": "warn", "warnings": warnings})
	}
	return Result{}, nil
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
