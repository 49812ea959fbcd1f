package subagents

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// progressLines is how many of a child's last steps status shows (Yuxi
// shows 3).
const progressLines = 3

// progressText bounds one progress line.
const progressText = 300

var (
	toolStartedMarker = []byte(`"type":"tool.started"`)
	completedMarker   = []byte(`"type":"message.completed"`)
	startedMarker     = []byte(`"type":"run.started"`)
)

// progressLine turns one event of a child into a line a person or a model
// can read, or "".
func progressLine(ev *protocol.Event) string {
	switch ev.Type {
	case protocol.EventToolStarted:
		var d protocol.ToolEventData
		if json.Unmarshal(ev.Data, &d) != nil {
			return ""
		}
		args := oneLine(d.Arguments)
		if args == "" || args == "{}" {
			return fmt.Sprintf("calls %s", d.Name)
		}
		return fmt.Sprintf("calls %s %s", d.Name, clip(args, progressText))
	case protocol.EventMessageCompleted:
		var m model.Message
		if json.Unmarshal(ev.Data, &m) != nil {
			return ""
		}
		if text := oneLine(m.Content); text != "" {
			return "says: " + clip(text, progressText)
		}
	case protocol.EventRunStarted:
		var d protocol.StartedData
		if json.Unmarshal(ev.Data, &d) == nil && d.Attempt > 1 {
			return fmt.Sprintf("continues on another worker (attempt %d)", d.Attempt)
		}
	}
	return ""
}

// follow passes each step of a running child to fn, from a core
// subscription to its events, until stop is called. Steps published while
// nobody follows are not replayed (status reads them from the stream).
func (s *Service) follow(rec *protocol.Run, fn func(string)) (stop func()) {
	sub, err := s.nc.Subscribe(s.names.RunEvents(rec.Tenant, rec.ThreadID, rec.RunID), func(m *nats.Msg) {
		// Token deltas are most of a run's events: skip them unread.
		if !bytes.Contains(m.Data, toolStartedMarker) && !bytes.Contains(m.Data, completedMarker) && !bytes.Contains(m.Data, startedMarker) {
			return
		}
		var ev protocol.Event
		if json.Unmarshal(m.Data, &ev) != nil {
			return
		}
		if line := progressLine(&ev); line != "" {
			fn(line)
		}
	})
	if err != nil {
		return func() {}
	}
	return func() { _ = sub.Unsubscribe() }
}

// progress reads a child's last n steps from the events stream: its tool
// calls and its last completed message.
func (s *Service) progress(ctx context.Context, rec *protocol.Run, n int) []string {
	type step struct {
		seq  uint64
		line string
	}
	var steps []step
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	oc, err := s.js.OrderedConsumer(ctx, s.names.EventsStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{s.names.EventSubject(rec.Tenant, rec.ThreadID, rec.RunID, protocol.KindTools)},
		// Removed below; the threshold covers a process that dies first.
		InactiveThreshold: 10 * time.Second,
	})
	if err == nil {
		defer func() {
			if info := oc.CachedInfo(); info != nil {
				_ = s.js.DeleteConsumer(context.WithoutCancel(ctx), s.names.EventsStream(), info.Name)
			}
		}()
		for range 100 {
			batch, err := oc.FetchNoWait(256)
			if err != nil {
				break
			}
			got := 0
			for m := range batch.Messages() {
				got++
				if !bytes.Contains(m.Data(), toolStartedMarker) {
					continue
				}
				var ev protocol.Event
				if json.Unmarshal(m.Data(), &ev) == nil {
					if line := progressLine(&ev); line != "" {
						steps = append(steps, step{ev.Seq, line})
					}
				}
			}
			if got == 0 {
				break
			}
		}
	}
	if m, err := s.evs.GetLastMsgForSubject(ctx, s.names.EventSubject(rec.Tenant, rec.ThreadID, rec.RunID, protocol.KindMessages)); err == nil {
		var ev protocol.Event
		if json.Unmarshal(m.Data, &ev) == nil {
			line := progressLine(&ev)
			if ev.Type == protocol.EventMessageDelta && !rec.Status.Terminal() {
				line = "is writing a response"
			}
			if line != "" {
				steps = append(steps, step{ev.Seq, line})
			}
		}
	}
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].seq < steps[j].seq })
	if len(steps) > n {
		steps = steps[len(steps)-n:]
	}
	out := make([]string, len(steps))
	for i, st := range steps {
		out[i] = st.line
	}
	return out
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }
