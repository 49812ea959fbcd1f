package natsagent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
)

// Tool is something a model can call. Build one with [NewTool]; implement
// the interface yourself only when a tool needs the raw call.
type Tool = tools.Tool

// Parts of a raw tool call, for a [Tool] implemented by hand.
type (
	// ToolInvocation is one call of a tool: its id, name, JSON arguments
	// and the run's environment.
	ToolInvocation = tools.Call
	// ToolOutput is what a tool returns: text, an error flag the model
	// reads, and an optional state update.
	ToolOutput = tools.Result
	// ToolEnv is what a tool may use of the run that calls it: tenant,
	// thread, run, user and the thread's files.
	ToolEnv = tools.Env
)

type toolEnvKey struct{}

// ToolEnvFrom returns the environment of the run calling a typed tool (see
// [NewTool]), or nil outside a tool call.
func ToolEnvFrom(ctx context.Context) *ToolEnv {
	env, _ := ctx.Value(toolEnvKey{}).(*ToolEnv)
	return env
}

// NewTool builds a typed tool. The JSON schema the model sees is generated
// from Args as the built-in tools' are (a struct: `json` tags name the
// fields, and a field without omitempty is required; `jsonschema` tags
// describe them; `schema` tags add enum=a|b|c, minimum=N, maximum=N, or
// "-" to hide a field); the model's arguments are validated against it and
// decoded into Args before fn runs. A string Result is the tool's text;
// any other Result is sent as JSON. An error from fn is a tool result the
// model reads; it never fails the run.
//
// NewTool panics when name is not a valid tool name or no schema can be
// generated from Args: both are mistakes in the program, found at start.
func NewTool[Args, Result any](name, description string, fn func(ctx context.Context, args Args) (Result, error)) Tool {
	if !protocol.ValidToken(name) {
		panic(fmt.Sprintf("natsagent.NewTool: tool name %q must match ^[A-Za-z0-9_-]{1,128}$", name))
	}
	schema, err := tools.SchemaOf(reflect.TypeFor[Args]())
	if err != nil {
		panic(fmt.Sprintf("natsagent.NewTool(%s): %v", name, err))
	}
	resolved, err := schema.Resolve(nil)
	if err != nil {
		panic(fmt.Sprintf("natsagent.NewTool(%s): %v", name, err))
	}
	params, err := json.Marshal(schema)
	if err != nil {
		panic(fmt.Sprintf("natsagent.NewTool(%s): %v", name, err))
	}
	return &typedTool[Args, Result]{
		spec:   ToolSpec{Name: name, Description: description, Parameters: params},
		schema: resolved,
		fn:     fn,
	}
}

type typedTool[Args, Result any] struct {
	spec   ToolSpec
	schema *jsonschema.Resolved
	fn     func(context.Context, Args) (Result, error)
}

func (t *typedTool[Args, Result]) Spec() ToolSpec { return t.spec }

func (t *typedTool[Args, Result]) Call(ctx context.Context, call *ToolInvocation) (*ToolOutput, error) {
	raw := bytes.TrimSpace(call.Args)
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	var instance any
	if err := json.Unmarshal(raw, &instance); err != nil {
		return nil, fmt.Errorf("arguments are not JSON: %v", err)
	}
	if err := t.schema.Validate(instance); err != nil {
		return nil, fmt.Errorf("arguments do not match the schema of %s: %v", t.spec.Name, err)
	}
	var args Args
	if err := json.Unmarshal(raw, &args); err != nil {
		return nil, fmt.Errorf("arguments of %s: %v", t.spec.Name, err)
	}
	if call.Env != nil {
		ctx = context.WithValue(ctx, toolEnvKey{}, call.Env)
	}
	res, err := t.fn(ctx, args)
	if err != nil {
		return nil, err
	}
	if s, ok := any(res).(string); ok {
		return tools.Text(s), nil
	}
	out, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("result of %s: %v", t.spec.Name, err)
	}
	return tools.Text(string(out)), nil
}
