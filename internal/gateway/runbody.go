package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/natsagent/natsagent/internal/langgraph"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// runBody is the body of a run creation, in the LangGraph shape with
// natsagent's names accepted too ("agent" for "assistant_id").
type runBody struct {
	AssistantID       string          `json:"assistant_id"`
	Agent             string          `json:"agent"`
	Input             *runInput       `json:"input"`
	Command           *runCommand     `json:"command"`
	Config            json.RawMessage `json:"config"`
	Metadata          map[string]any  `json:"metadata"`
	MultitaskStrategy string          `json:"multitask_strategy"`
	// RunID is natsagent's extension: a client-chosen id makes retries
	// idempotent.
	RunID string `json:"run_id"`
	// IfNotExists is create (default) or reject (404 for a missing thread).
	IfNotExists string `json:"if_not_exists"`
	// forkFields start the run from an earlier checkpoint (lgstate.go).
	forkFields
	// streamFields are stream_mode and stream_subgraphs (lgstream.go).
	streamFields
	// StreamResumable is LangGraph's: store every event (token deltas
	// too) so a stream resumed with Last-Event-ID misses none
	// (protocol.RunRequest.StreamResumable). A JSON boolean.
	StreamResumable bool `json:"stream_resumable"`
}

type runInput struct {
	Messages []inputMessage `json:"messages"`
}

// inputMessage accepts a message as natsagent writes it ({"role",
// "content"}) and as LangChain clients do ({"type": "human"}, content as a
// list of blocks): internal/langgraph reads both.
type inputMessage = langgraph.Input

type runCommand struct {
	Resume json.RawMessage `json:"resume"`
	Update json.RawMessage `json:"update"`
	Goto   json.RawMessage `json:"goto"`
}

// configurable is LangGraph's per-run config map; its known keys fill the
// protocol.RunConfig fields the top level of config leaves empty.
type configurable struct {
	Configurable map[string]json.RawMessage `json:"configurable"`
}

// Run creation options beyond the run request.
const (
	ifNotExistsCreate = "create"
	ifNotExistsReject = "reject"
)

// langGraphInterrupt is LangGraph's name for what natsagent calls steer:
// stop the active run, keep what it did, run the new one.
const langGraphInterrupt = "interrupt"

// request builds and validates the run request of a body.
func (s *Server) request(b *runBody, tenant, thread string) (*protocol.RunRequest, error) {
	switch b.IfNotExists {
	case "", ifNotExistsCreate, ifNotExistsReject:
	default:
		return nil, errInvalid("if_not_exists", fmt.Sprintf("%q is not one of create, reject", clip(b.IfNotExists)))
	}
	agentName := b.Agent
	switch {
	case b.AssistantID != "" && b.Agent != "" && b.AssistantID != b.Agent:
		return nil, errInvalid("agent", fmt.Sprintf("assistant_id %q and agent %q name different agents; send one of them", clip(b.AssistantID), clip(b.Agent)))
	case agentName == "":
		agentName = b.AssistantID
	}
	if agentName == "" {
		agentName = s.cfg.DefaultAgent
	}
	strategy := b.MultitaskStrategy
	if strategy == langGraphInterrupt {
		strategy = protocol.StrategySteer
	}
	runID := b.RunID
	if runID == "" {
		runID = newID()
	}
	req := &protocol.RunRequest{
		RunID:             runID,
		ThreadID:          thread,
		Tenant:            tenant,
		Agent:             agentName,
		MultitaskStrategy: strategy,
		Metadata:          b.Metadata,
		StreamResumable:   b.StreamResumable,
	}
	if b.Input != nil {
		msgs, err := inputMessages(b.Input.Messages)
		if err != nil {
			return nil, err
		}
		req.Input = &protocol.Input{Messages: msgs}
	}
	if c := b.Command; c != nil {
		if len(c.Update) > 0 && !bytes.Equal(c.Update, []byte("null")) {
			return nil, errInvalid("command.update", "is not supported: resume an interrupted thread with command.resume")
		}
		if len(c.Goto) > 0 && !bytes.Equal(c.Goto, []byte("null")) {
			return nil, errInvalid("command.goto", "is not supported: resume an interrupted thread with command.resume")
		}
		req.Command = &protocol.Command{Resume: c.Resume}
	}
	cfg, err := runConfig(b.Config)
	if err != nil {
		return nil, err
	}
	req.Config = cfg
	req.Normalize()
	if err := req.Validate(); err != nil {
		return nil, err
	}
	return req, nil
}

// runConfig reads a run's config: protocol.RunConfig, with LangGraph's
// "configurable" keys filling what the top level leaves empty.
func runConfig(raw json.RawMessage) (protocol.RunConfig, error) {
	var out protocol.RunConfig
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return out, nil
	}
	var c configurable
	for _, v := range []any{&out, &c} {
		if err := json.Unmarshal(raw, v); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				field := "config"
				if te.Field != "" {
					field += "." + te.Field
				}
				return out, errInvalid(field, fmt.Sprintf("%s must be %s, not %s", field, jsonKind(te.Type), te.Value))
			}
			return out, errInvalid("config", "config must be an object: "+err.Error())
		}
	}
	for key, raw := range c.Configurable {
		field := "config.configurable." + key
		var err error
		switch key {
		case "model":
			if out.Model == "" {
				err = json.Unmarshal(raw, &out.Model)
			}
		case "tool_approval_mode":
			if out.ToolApprovalMode == "" {
				err = json.Unmarshal(raw, &out.ToolApprovalMode)
			}
		case "max_steps":
			if out.MaxSteps == 0 {
				err = json.Unmarshal(raw, &out.MaxSteps)
			}
		case "timeout_seconds":
			if out.TimeoutSeconds == 0 {
				err = json.Unmarshal(raw, &out.TimeoutSeconds)
			}
		case "user_id":
			if out.UserID == "" {
				err = json.Unmarshal(raw, &out.UserID)
			}
		}
		if err != nil {
			return out, errInvalid(field, fmt.Sprintf("%s: %v", field, err))
		}
	}
	return out, nil
}

// inputMessages converts input messages to the model's (langgraph.ToModel:
// LangChain types and content blocks); Validate then refuses the roles
// and image parts input may not hold.
func inputMessages(in []inputMessage) ([]model.Message, error) {
	out := make([]model.Message, 0, len(in))
	for i, m := range in {
		msg, err := langgraph.ToModel(m)
		var fe *langgraph.FieldError
		if errors.As(err, &fe) {
			field := fmt.Sprintf("input.messages[%d].%s", i, fe.Field)
			return nil, errInvalid(field, field+": "+fe.Msg)
		}
		if err != nil {
			return nil, errInvalid(fmt.Sprintf("input.messages[%d]", i), err.Error())
		}
		out = append(out, msg)
	}
	return out, nil
}

func clip(s string) string {
	if len(s) <= 40 {
		return s
	}
	return s[:40] + "..."
}
