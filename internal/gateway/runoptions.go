package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"

	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/webhook"
)

// LangGraph's run options, as natsagent serves them (docs/protocol.md
// 3.4). Each option either works or is refused by name: none is accepted
// and ignored.

// on_disconnect values.
const (
	onDisconnectContinue = "continue"
	onDisconnectCancel   = "cancel"
)

// MaxAfterSeconds bounds after_seconds (30 days).
const MaxAfterSeconds = 30 * 24 * 3600

// checkOptions checks the options that do not become part of the run
// request, and refuses those natsagent does not serve.
func (s *Server) checkOptions(b *runBody) error {
	switch b.OnDisconnect {
	case "", onDisconnectContinue, onDisconnectCancel:
	default:
		return errInvalid("on_disconnect", fmt.Sprintf("%q is not one of continue, cancel", clip(b.OnDisconnect)))
	}
	switch b.OnCompletion {
	case "", "keep":
	case "delete":
		return errInvalid("on_completion", "delete is not served: natsagent keeps the thread of a run; delete it with DELETE /threads/{thread_id} once the run ended")
	default:
		return errInvalid("on_completion", fmt.Sprintf("%q is not one of keep, delete", clip(b.OnCompletion)))
	}
	if _, err := afterSeconds(b); err != nil {
		return err
	}
	if b.CheckpointDuring != nil && !*b.CheckpointDuring {
		return errInvalid("checkpoint_during", "false is not served: natsagent checkpoints after every step, which is how another worker continues a run whose worker died")
	}
	switch b.Durability {
	case "", "sync", "async":
		// natsagent saves every step before the next begins: at least
		// what either asks.
	case "exit":
		return errInvalid("durability", "exit is not served: natsagent checkpoints after every step, which is how another worker continues a run whose worker died")
	default:
		return errInvalid("durability", fmt.Sprintf("%q is not one of sync, async, exit", clip(b.Durability)))
	}
	if !isNull(b.FeedbackKeys) && !bytes.Equal(bytes.TrimSpace(b.FeedbackKeys), []byte("[]")) {
		return errInvalid("feedback_keys", "LangSmith feedback is not served; leave it out")
	}
	if !isNull(b.LangsmithTracer) {
		return errInvalid("langsmith_tracer", "LangSmith tracing is not served; natsagent traces with OpenTelemetry (operations.md, Observability)")
	}
	if b.Webhook != nil && *b.Webhook != "" {
		if _, err := webhook.CheckURL(*b.Webhook); err != nil {
			return errInvalid("webhook", err.Error())
		}
	}
	return nil
}

// checkWebhook refuses, at submission, a webhook whose host is or
// resolves to an address the deployment does not allow. The delivery
// checks the address it dials again (a name may resolve elsewhere later).
func (s *Server) checkWebhook(ctx context.Context, req *protocol.RunRequest) error {
	if req.Webhook == "" {
		return nil
	}
	u, err := webhook.CheckURL(req.Webhook)
	if err == nil {
		err = webhook.CheckHost(ctx, u, s.cfg.WebhookAllowPrivate)
	}
	if err != nil {
		return errInvalid("webhook", err.Error())
	}
	return nil
}

// afterSeconds reads after_seconds: 0 when absent.
func afterSeconds(b *runBody) (float64, error) {
	if b.AfterSeconds == nil {
		return 0, nil
	}
	v, err := b.AfterSeconds.Float64()
	if err != nil || math.IsNaN(v) || v < 0 || v > MaxAfterSeconds {
		return 0, errInvalid("after_seconds", fmt.Sprintf("%s is out of range: use 0 to %d seconds", clip(b.AfterSeconds.String()), MaxAfterSeconds))
	}
	return v, nil
}

// interruptOptions maps interrupt_before and interrupt_after onto the
// approval middleware: pausing before the tools node is mode always_ask
// (a person decides on every tool call first). Pausing before the model,
// or after any node, has no natsagent equivalent and is refused.
func interruptOptions(b *runBody, cfg *protocol.RunConfig) error {
	before, err := nodeList(b.InterruptBefore, "interrupt_before")
	if err != nil {
		return err
	}
	for _, n := range before {
		if n != protocol.GotoTools {
			return errInvalid("interrupt_before", fmt.Sprintf("%q: natsagent can pause before tools (a person approves every tool call) only; send [\"tools\"]", clip(n)))
		}
		if cfg.ToolApprovalMode == protocol.ApprovalAlwaysTrust {
			return errInvalid("interrupt_before", "asks to pause before tools, and config.tool_approval_mode always_trust asks never to: send one of them")
		}
		cfg.ToolApprovalMode = protocol.ApprovalAlwaysAsk
	}
	after, err := nodeList(b.InterruptAfter, "interrupt_after")
	if err != nil {
		return err
	}
	if len(after) > 0 {
		return errInvalid("interrupt_after", "is not served: natsagent pauses before tool calls (interrupt_before [\"tools\"]), not after a node")
	}
	return nil
}

// nodeList reads "*" or a list of node names.
func nodeList(raw json.RawMessage, field string) ([]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var all string
	if json.Unmarshal(raw, &all) == nil {
		if all == "*" {
			return nil, errInvalid(field, "\"*\" (every node) is not served: natsagent can pause before tools only; send [\"tools\"]")
		}
		return nil, errInvalid(field, "must be a list of node names")
	}
	var nodes []string
	if err := json.Unmarshal(raw, &nodes); err != nil {
		return nil, errInvalid(field, "must be a list of node names")
	}
	return nodes, nil
}
