package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/agent"
	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// toolSteps is how many tool-calling steps each run of the long thread
// makes before it answers. Each asks current_time for another zone, so
// loop detection (identical calls) never trips.
const toolSteps = 4

var zones = [toolSteps]string{"UTC", "Europe/Paris", "Asia/Tokyo", "America/New_York"}

// runThread grows one thread to the largest of cfg.ThreadSizes messages
// with real runs on a real worker (each run: a user message, four steps
// of one current_time call, an answer) and reads the checkpoints bucket's
// stream size at every model call: the growth between two model calls of
// a run is what one step (a model response and its tool batch) wrote. It
// then times the agent loop in process (agent.Execute with an in-memory
// host) on histories of each size: from run start to the model call, and
// from a tool result to the next model call.
func runThread(ctx context.Context, e *env, s *scenarioRun) error {
	if e.cfg.Model == ModelHTTP {
		s.note("always uses an in-process model: the model is the measuring probe, and the figures are storage and loop costs")
	}
	if err := threadCheckpoints(ctx, e, s); err != nil {
		return err
	}
	return threadPrepare(ctx, e, s)
}

// callSample is what the thread's model saw at one call.
type callSample struct {
	run     string // id of the run's user message
	step    int    // tool steps of this run before the call
	history int    // messages in the transcript
	bytes   uint64 // checkpoints stream size at the call
	content int    // JSON size of the messages added since the previous call of the run
	in, out time.Time
}

func threadCheckpoints(ctx context.Context, e *env, s *scenarioRun) error {
	cfg := e.cfg
	d, err := e.deploy(ctx, "thread")
	if err != nil {
		return err
	}
	defer d.close()
	ckpts, err := e.js.Stream(ctx, "KV_"+d.names.CheckpointsBucket())
	if err != nil {
		return err
	}
	var (
		mu      sync.Mutex
		samples []callSample
		prevLen = map[string]int{}
		infoErr error
	)
	// Always in process: the model is the measuring probe here, and the
	// figures are storage, not model transport.
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		in := time.Now()
		msgs := withoutSystem(req.Messages)
		run, step := "", 0
		for i := len(msgs) - 1; i >= 0; i-- {
			if msgs[i].Role == model.RoleUser {
				run = msgs[i].ID
				break
			}
			if msgs[i].Role == model.RoleAssistant {
				step++
			}
		}
		bytes, err := e.streamBytes(ctx, ckpts)
		mu.Lock()
		if err != nil && infoErr == nil {
			infoErr = err
		}
		content := 0
		if p, ok := prevLen[run]; ok && p <= len(msgs) {
			content = wireSize(msgs[p:])
		}
		prevLen[run] = len(msgs)
		samples = append(samples, callSample{run: run, step: step, history: len(msgs), bytes: bytes, content: content, in: in})
		idx := len(samples) - 1
		mu.Unlock()

		resp := &model.Response{Message: model.Message{Role: model.RoleAssistant}, FinishReason: model.FinishStop, Model: "bench"}
		if step < toolSteps {
			resp.Message.ToolCalls = []model.ToolCall{{ID: fmt.Sprintf("call_%s_%d", run, step), Name: "current_time", Arguments: fmt.Sprintf(`{"timezone":%q}`, zones[step])}}
			resp.FinishReason = model.FinishToolCalls
		} else {
			resp.Message.Content = "Those are the times you asked for."
			if onDelta != nil {
				onDelta(model.Delta{Content: resp.Message.Content})
			}
		}
		mu.Lock()
		samples[idx].out = time.Now()
		mu.Unlock()
		return resp, nil
	})
	if err := d.startWorkers(ctx, m, 4, 1); err != nil {
		return err
	}
	perRun := 2 + 2*toolSteps
	// Three runs are measured at each size: grow a little past the largest.
	const measuredRuns = 3
	runs := slices.Max(cfg.ThreadSizes)/perRun + 1 + measuredRuns
	e.progress.stage("thread: growing", runs)
	var tracks []*track
	for i := range runs {
		if ctx.Err() != nil {
			break
		}
		id := fmt.Sprintf("r%d", i)
		t, err := d.submit("long", id, request("long", id, fmt.Sprintf("Turn %d: what time is it in UTC, Paris, Tokyo and New York?", i), ""))
		if err != nil {
			return err
		}
		tracks = append(tracks, t)
		if !waitOne(ctx, d, t) {
			break
		}
	}
	oc := d.obs.outcome(tracks)
	checkStatuses(s, "long thread", oc, protocol.StatusSuccess)
	if oc.lost > 0 && ctx.Err() == nil {
		s.add(Row{Key: "thread.lost", Metric: "lost runs", Value: float64(oc.lost), Unit: unitCount}.atMost(0, "0"))
	}
	if ctx.Err() != nil {
		s.outOfTime = true
	}
	if infoErr != nil {
		return fmt.Errorf("read the checkpoints stream: %w", infoErr)
	}

	mu.Lock()
	defer mu.Unlock()
	for _, size := range cfg.ThreadSizes {
		// The steps of the first runs whose history reached size. A run's
		// first call is skipped: the checkpoint after it also holds the
		// run's input.
		var bytes, content []float64
		var gaps durations
		var measured []string
		for i := 1; i < len(samples); i++ {
			a, b := samples[i-1], samples[i]
			if a.run != b.run || b.step != a.step+1 || a.step == 0 || a.history < size {
				continue
			}
			if !slices.Contains(measured, a.run) {
				if len(measured) == measuredRuns {
					break
				}
				measured = append(measured, a.run)
			}
			bytes = append(bytes, float64(b.bytes)-float64(a.bytes))
			content = append(content, float64(b.content))
			gaps = append(gaps, b.in.Sub(a.out))
		}
		if len(bytes) == 0 {
			s.note("no step was measured at %d messages (the thread did not grow that far)", size)
			continue
		}
		per, newContent := mean(bytes), mean(content)
		limit := 2*newContent + 1024
		s.add(Row{Key: fmt.Sprintf("thread.h%d.checkpoint_bytes", size), Metric: fmt.Sprintf("checkpoint bytes per step at %s msgs (new content as baseline)", group(float64(size))), Value: per, Unit: unitBytes}.
			withBaseline(newContent, unitBytes).
			atMost(limit, fmt.Sprintf("≤ 2×new+1KiB = %s B", group(limit))))
		s.add(Row{Key: fmt.Sprintf("thread.h%d.step_gap", size), Metric: fmt.Sprintf("worker: response → next model call (tool + 2 checkpoints) at %s msgs, p50", group(float64(size))), Value: us(gaps.percentile(0.5)), Unit: unitMicros})
	}
	return nil
}

// withoutSystem drops a leading system message (older loops sent the
// system prompt as one).
func withoutSystem(msgs []model.Message) []model.Message {
	if len(msgs) > 0 && msgs[0].Role == model.RoleSystem {
		return msgs[1:]
	}
	return msgs
}

// wireSize is the JSON size of messages as a model sees them: without
// natsagent's bookkeeping (meta, status).
func wireSize(msgs []model.Message) int {
	n := 0
	for _, m := range msgs {
		m.Meta, m.Status = nil, ""
		data, _ := json.Marshal(m)
		n += len(data)
	}
	return n
}

// memHost is an agent.Host that keeps nothing: the loop's own cost is
// measured, not storage.
type memHost struct{}

func (memHost) Checkpoint(context.Context, state.Update) error { return nil }
func (memHost) Emit(string, any)                               {}

// threadPrepare times agent.Execute in process with the chatbot's real
// chain on histories of each size, with a model that answers at once: a
// tool call, then an answer.
func threadPrepare(ctx context.Context, e *env, s *scenarioRun) error {
	cfg := e.cfg
	var (
		call          int
		first, second time.Time
		returned      time.Time
	)
	m := model.Func(func(ctx context.Context, req *model.Request, onDelta func(model.Delta)) (*model.Response, error) {
		now := time.Now()
		call++
		if call == 1 {
			first = now
			defer func() { returned = time.Now() }()
			return &model.Response{Message: model.Message{Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: fmt.Sprintf("call_p%d", call), Name: "current_time", Arguments: `{}`}}}, FinishReason: model.FinishToolCalls}, nil
		}
		second = now
		return &model.Response{Message: model.Message{Role: model.RoleAssistant, Content: "It is now."}, FinishReason: model.FinishStop}, nil
	})
	agents, err := agent.NewAgents(m, tools.NewRegistry(), agent.Chatbot())
	if err != nil {
		return err
	}
	req := &protocol.RunRequest{RunID: "prep", ThreadID: "prep", Input: &protocol.Input{Messages: []model.Message{{Role: model.RoleUser, Content: "hi"}}}}
	req.Normalize()
	prep, err := agents.Prepare(req)
	if err != nil {
		return err
	}
	sizes := slices.Clone(cfg.ThreadSizes)
	slices.Sort(sizes)
	bases := make(map[int]*state.State, len(sizes))
	for _, size := range sizes {
		bases[size] = history(size)
	}
	toFirst, toNext := map[int]durations{}, map[int]durations{}
	e.progress.stage("thread: agent loop", len(sizes)*cfg.ThreadSamples)
	// Sizes take turns, so a noisy moment of the machine hits them alike.
samples:
	for i := range cfg.ThreadSamples {
		for _, size := range sizes {
			if ctx.Err() != nil {
				s.outOfTime = true
				break samples
			}
			st := bases[size].Clone()
			call = 0
			run := &agent.Run{
				Runtime: &middleware.Runtime{
					RunID: fmt.Sprintf("prep%d", i), ThreadID: "prep", Tenant: protocol.DefaultTenant, Agent: protocol.DefaultAgent,
					Tools: prep.Tools, Logger: zap.NewNop(), Emit: func(string, any) {},
				},
				Chain: prep.Chain, Model: prep.Model, ModelName: prep.ModelName, System: prep.Profile.SystemPrompt,
				MaxSteps: prep.MaxSteps, State: st, Host: memHost{},
				Input: []model.Message{{Role: model.RoleUser, Content: "What time is it?"}},
			}
			start := time.Now()
			out := agent.Execute(ctx, run)
			if out.Status != protocol.StatusSuccess || call != 2 {
				return fmt.Errorf("in-process loop at %d messages ended %q after %d model calls: %s", size, out.Status, call, out.Error)
			}
			toFirst[size] = append(toFirst[size], first.Sub(start))
			toNext[size] = append(toNext[size], second.Sub(returned))
			e.progress.add(1)
		}
	}
	firstP50, nextP50 := map[int]time.Duration{}, map[int]time.Duration{}
	for _, size := range sizes {
		if len(toFirst[size]) == 0 {
			break
		}
		firstP50[size], nextP50[size] = toFirst[size].percentile(0.5), toNext[size].percentile(0.5)
		s.add(Row{Key: fmt.Sprintf("thread.h%d.prepare_first", size), Metric: fmt.Sprintf("loop: run start → model call at %s msgs, p50", group(float64(size))), Value: us(firstP50[size]), Unit: unitMicros})
		s.add(Row{Key: fmt.Sprintf("thread.h%d.prepare_next", size), Metric: fmt.Sprintf("loop: tool result → model call at %s msgs, p50", group(float64(size))), Value: us(nextP50[size]), Unit: unitMicros})
	}
	small, large := sizes[0], sizes[len(sizes)-1]
	if a, b := firstP50[small], firstP50[large]; a > 0 && b > 0 && large > small {
		// Informational: a run's first call checks the loaded transcript
		// once for repair (about 0.1 µs a message), as loading it from
		// checkpoints is linear anyway; the per-call target is below.
		s.add(Row{Key: "thread.prepare_first_growth", Metric: fmt.Sprintf("loop: run start → model call (once per run), %s vs %s msgs", group(float64(large)), group(float64(small))), Value: float64(b) / float64(a), Unit: unitTimes})
	}
	if a, b := nextP50[small], nextP50[large]; a > 0 && b > 0 && large > small {
		s.add(Row{Key: "thread.prepare_next_growth", Metric: fmt.Sprintf("loop: tool result → model call, %s vs %s msgs", group(float64(large)), group(float64(small))), Value: float64(b) / float64(a), Unit: unitTimes}.atMost(2, "flat (≤ 2×)"))
	}
	return nil
}

// history builds a thread state of n messages shaped like real turns: a
// question, a tool call, its result and an answer, from earlier runs.
func history(n int) *state.State {
	st := &state.State{}
	var msgs []model.Message
	meta := func(turn int) map[string]any { return map[string]any{agent.MetaRunID: fmt.Sprintf("old%d", turn)} }
	for turn := 0; len(msgs) < n; turn++ {
		id := func(kind string) string { return fmt.Sprintf("msg_%s%d", kind, turn) }
		msgs = append(msgs, model.Message{ID: id("u"), Role: model.RoleUser, Content: fmt.Sprintf("Turn %d: what time is it in Paris?", turn), Meta: meta(turn)})
		if len(msgs)+3 <= n {
			call := fmt.Sprintf("call_old%d", turn)
			msgs = append(msgs,
				model.Message{ID: id("a"), Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: call, Name: "current_time", Arguments: `{"timezone":"Europe/Paris"}`}}, Meta: meta(turn)},
				model.Message{ID: id("t"), Role: model.RoleTool, ToolCallID: call, Name: "current_time", Content: "Mon, 02 Jan 2006 15:04:05 +0100", Status: model.ToolStatusSuccess, Meta: meta(turn)},
			)
		}
		if len(msgs) < n {
			msgs = append(msgs, model.Message{ID: id("f"), Role: model.RoleAssistant, Content: "It is 15:04 in Paris.", Meta: meta(turn)})
		}
	}
	st.Apply(state.Update{Messages: msgs})
	if u, err := state.SetValue(middleware.TitleValue, "Times around the world"); err == nil {
		st.Apply(u)
	}
	return st
}
