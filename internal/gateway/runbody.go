package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"

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

	// LangGraph's run options (runoptions.go).
	Context          json.RawMessage `json:"context"`
	Webhook          *string         `json:"webhook"`
	OnDisconnect     string          `json:"on_disconnect"`
	OnCompletion     string          `json:"on_completion"`
	AfterSeconds     *json.Number    `json:"after_seconds"`
	CheckpointDuring *bool           `json:"checkpoint_during"`
	Durability       string          `json:"durability"`
	InterruptBefore  json.RawMessage `json:"interrupt_before"`
	InterruptAfter   json.RawMessage `json:"interrupt_after"`
	FeedbackKeys     json.RawMessage `json:"feedback_keys"`
	LangsmithTracer  json.RawMessage `json:"langsmith_tracer"`
	// Tenant is ignored: the tenant comes from authentication (3.1).
	Tenant json.RawMessage `json:"tenant"`

	// unknown lists the body's fields no one reads: each is refused.
	unknown []string
	// images are the input images request found (images.go).
	images []inputImage
}

// UnmarshalJSON decodes a run body and notes the fields it does not know,
// which request refuses by name: an option silently ignored is a bug a
// client cannot see.
func (b *runBody) UnmarshalJSON(data []byte) error {
	type plain runBody
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode((*plain)(b)); err != nil {
		return err
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		return err
	}
	known := runBodyFields()
	for k := range keys {
		if !known[k] {
			b.unknown = append(b.unknown, k)
		}
	}
	sort.Strings(b.unknown)
	return nil
}

// addJSONFields adds the JSON names of t's fields to out, those of an
// embedded struct (forkFields) included.
func addJSONFields(out map[string]bool, t reflect.Type) {
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			addJSONFields(out, f.Type)
			continue
		}
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
			out[name] = true
		}
	}
}

// runBodyFields are the JSON names of runBody's fields.
func runBodyFields() map[string]bool {
	out := map[string]bool{}
	addJSONFields(out, reflect.TypeFor[runBody]())
	return out
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
	if len(b.unknown) > 0 {
		return nil, errInvalid(clip(b.unknown[0]), fmt.Sprintf("%q is not a run option natsagent knows; remove it (docs/protocol.md 3.4 lists the options)", clip(b.unknown[0])))
	}
	if err := s.checkOptions(b); err != nil {
		return nil, err
	}
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
	if b.Webhook != nil {
		req.Webhook = *b.Webhook
	}
	if b.Input != nil {
		msgs, err := inputMessages(b.Input.Messages)
		if err != nil {
			return nil, err
		}
		if b.images, err = s.takeImages(msgs); err != nil {
			return nil, err
		}
		req.Input = &protocol.Input{Messages: msgs}
	}
	if c := b.Command; c != nil {
		cmd, err := command(c)
		if err != nil {
			return nil, err
		}
		req.Command = cmd
	}
	cfg, err := runConfig(b.Config, b.Context)
	if err != nil {
		return nil, err
	}
	if err := interruptOptions(b, &cfg); err != nil {
		return nil, err
	}
	req.Config = cfg
	req.Normalize()
	if err := req.Validate(); err != nil {
		return nil, err
	}
	return req, nil
}

// runConfig reads a run's config: protocol.RunConfig at its top level,
// then LangGraph's context and config.configurable filling what the top
// level leaves empty. A key natsagent does not read is refused by name.
func runConfig(raw, ctxRaw json.RawMessage) (protocol.RunConfig, error) {
	var out protocol.RunConfig
	if !isNull(raw) {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(raw, &keys); err != nil {
			return out, errInvalid("config", "config must be an object")
		}
		for _, k := range sortedKeys(keys) {
			if !runConfigKeys[k] && k != "configurable" {
				return out, errInvalid("config."+clip(k), fmt.Sprintf("config.%s is not a setting natsagent reads: use model, tool_approval_mode, max_steps, timeout_seconds, user_id or configurable", clip(k)))
			}
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
		if err := fillConfig(&out, c.Configurable, "config.configurable"); err != nil {
			return out, err
		}
	}
	if !isNull(ctxRaw) {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(ctxRaw, &keys); err != nil {
			return out, errInvalid("context", "context must be an object")
		}
		if err := fillConfig(&out, keys, "context"); err != nil {
			return out, err
		}
	}
	return out, nil
}

// runConfigKeys are the settings of protocol.RunConfig, which config,
// config.configurable and context may carry.
var runConfigKeys = map[string]bool{"model": true, "tool_approval_mode": true, "max_steps": true, "timeout_seconds": true, "user_id": true,
	"clarification": true, "subagents": true, "plan_mode": true}

// fillConfig sets the settings of keys that out leaves empty. LangGraph's
// own configurable keys: thread_id is the path's (as LangGraph sets it),
// checkpoint_id and checkpoint_ns must be empty.
func fillConfig(out *protocol.RunConfig, keys map[string]json.RawMessage, prefix string) error {
	for _, key := range sortedKeys(keys) {
		raw := keys[key]
		field := prefix + "." + clip(key)
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
		case "clarification":
			err = fillSwitch(&out.Clarification, raw)
		case "subagents":
			err = fillSwitch(&out.Subagents, raw)
		case "plan_mode":
			err = fillSwitch(&out.PlanMode, raw)
		case "thread_id":
			// LangGraph sets it from the path, whatever a client put
			// there; so does natsagent.
		case "checkpoint_id", "checkpoint_ns":
			var v string
			if !isNull(raw) && (json.Unmarshal(raw, &v) != nil || v != "") {
				return errInvalid(field, fmt.Sprintf("%s: name the checkpoint to run from with the body's checkpoint_id or checkpoint, not in the config", field))
			}
		default:
			return errInvalid(field, fmt.Sprintf("%s is not a setting natsagent reads: use model, tool_approval_mode, max_steps, timeout_seconds, user_id, clarification, subagents or plan_mode", field))
		}
		if err != nil {
			return errInvalid(field, fmt.Sprintf("%s: %v", field, err))
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
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

// fillSwitch sets a per-run switch that out leaves unset: true, false or
// null (unset).
func fillSwitch(sw **bool, raw json.RawMessage) error {
	if *sw != nil || isNull(raw) {
		return nil
	}
	var v bool
	if err := json.Unmarshal(raw, &v); err != nil {
		return errors.New("must be true or false")
	}
	*sw = &v
	return nil
}
