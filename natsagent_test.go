package natsagent_test

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/natsagent/natsagent"
	"github.com/natsagent/natsagent/natsagenttest"
)

type addArgs struct {
	A int `json:"a" jsonschema:"the first addend"`
	B int `json:"b" jsonschema:"the second addend"`
}

var addTool = natsagent.NewTool("add", "Adds two integers.", func(ctx context.Context, args addArgs) (int, error) {
	return args.A + args.B, nil
})

func toolNames(req natsagenttest.ModelRequest) []string {
	var out []string
	for _, t := range req.Tools {
		out = append(out, t.Function.Name)
	}
	return out
}

// A typed tool's schema comes from its argument struct; the model's call
// runs it, and its result goes back to the model.
func TestWorker_TypedToolEndToEnd(t *testing.T) {
	d := natsagenttest.Start(t, natsagent.Config{Agents: []natsagent.Agent{{
		Name:         "calc",
		SystemPrompt: "You add numbers.",
		Tools:        []natsagent.Tool{addTool},
	}}},
		natsagenttest.ToolCall("add", `{"a":2,"b":40}`),
		natsagenttest.Text("The sum is 42."),
	)
	res := d.Ask("t1", "calc", "What is 2 + 40?")
	natsagenttest.RequireStatus(t, res, natsagent.StatusSuccess)
	natsagenttest.RequireEvent(t, res, natsagent.EventToolFinished)
	if res.Output() != "The sum is 42." {
		t.Errorf("output %q", res.Output())
	}
	reqs := d.ModelRequests()
	if len(reqs) != 2 {
		t.Fatalf("%d model requests, want 2", len(reqs))
	}
	var params json.RawMessage
	for _, tl := range reqs[0].Tools {
		if tl.Function.Name == "add" {
			params = tl.Function.Parameters
		}
	}
	var schema struct {
		Type       string                     `json:"type"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(params, &schema); err != nil || schema.Type != "object" || schema.Properties["a"] == nil || !strings.Contains(string(schema.Properties["b"]), "second addend") {
		t.Errorf("add's schema as sent: %s (%v)", params, err)
	}
	if last := reqs[1].LastMessage(); last.Role != "tool" || last.Content != "42" {
		t.Errorf("the tool result sent back: %+v", last)
	}

	// Arguments that break the schema never reach the function: the model
	// reads why.
	d2 := natsagenttest.Start(t, natsagent.Config{Agents: []natsagent.Agent{{Name: "calc", Tools: []natsagent.Tool{addTool}}}},
		natsagenttest.ToolCall("add", `{"a":"two","b":40}`),
		natsagenttest.Text("Sorry."),
	)
	res = d2.Ask("t1", "calc", "What is two + 40?")
	natsagenttest.RequireStatus(t, res, natsagent.StatusSuccess)
	if last := d2.ModelRequests()[1].LastMessage(); !strings.Contains(last.Content, "schema") {
		t.Errorf("the model was not told the arguments are wrong: %q", last.Content)
	}
}

var email = regexp.MustCompile(`[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}`)

// redact is a middleware that replaces e-mail addresses before every model
// call; the thread keeps the original.
type redact struct{}

func (redact) Name() string { return "redact_pii" }

func (redact) WrapModelCall(ctx context.Context, rt *natsagent.Runtime, req *natsagent.ModelRequest, next natsagent.ModelHandler) (*natsagent.ModelResponse, error) {
	c := req.Clone()
	for i := range c.Messages {
		c.Messages[i].Content = email.ReplaceAllString(c.Messages[i].Content, "[email]")
	}
	return next(ctx, c)
}

func TestWorker_MiddlewareFromCode(t *testing.T) {
	d := natsagenttest.Start(t, natsagent.Config{Agents: []natsagent.Agent{{
		Name:       "support",
		Middleware: []natsagent.Middleware{redact{}},
	}}}, natsagenttest.Text("Noted."))
	res := d.Ask("t1", "support", "Write to bob@example.com please")
	natsagenttest.RequireStatus(t, res, natsagent.StatusSuccess)
	sent := d.ModelRequests()[0].LastMessage().Content
	if strings.Contains(sent, "bob@example.com") || !strings.Contains(sent, "[email]") {
		t.Errorf("the model saw %q", sent)
	}
	st, err := d.Client.State(context.Background(), "t1")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(st.Messages[0].Content, "bob@example.com") {
		t.Errorf("the thread lost the original: %q", st.Messages[0].Content)
	}
}

// Parts registered in code are named by a YAML configuration.
func TestWorker_YAMLNamesRegisteredParts(t *testing.T) {
	upper := natsagent.NewTool("shout_test", "Upper-cases text.", func(ctx context.Context, in struct {
		Text string `json:"text"`
	}) (string, error) {
		return strings.ToUpper(in.Text), nil
	})
	if err := natsagent.RegisterTool(upper); err != nil {
		t.Fatal(err)
	}
	if err := natsagent.RegisterTool(upper); err == nil {
		t.Error("a second registration of one tool name was accepted")
	}
	var built []string
	err := natsagent.RegisterMiddleware("yaml_redact_test", func(raw json.RawMessage) (natsagent.Middleware, error) {
		built = append(built, string(raw))
		return redact{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	yaml := `
agents:
  - name: loud
    system_prompt: You shout.
    tools: [shout_test]
    middleware:
      user:
        - use: yaml_redact_test
          settings: {mode: strict}
      settings:
        tool_exclusion: {exclude: [write_todos]}
`
	d := natsagenttest.Start(t, natsagent.Config{ConfigYAML: []byte(yaml)},
		natsagenttest.ToolCall("shout_test", `{"text":"hi a@b.io"}`),
		natsagenttest.Text("HI"),
	)
	res := d.Ask("t1", "loud", "shout hi to a@b.io")
	natsagenttest.RequireStatus(t, res, natsagent.StatusSuccess)
	reqs := d.ModelRequests()
	if got := reqs[1].LastMessage().Content; got != "HI [email]" {
		t.Errorf("tool result as the model saw it: %q", got)
	}
	if names := toolNames(reqs[0]); !slices.Contains(names, "shout_test") || slices.Contains(names, "write_todos") {
		t.Errorf("tools offered %v", names)
	}
	if len(built) == 0 || built[0] != `{"mode":"strict"}` {
		t.Errorf("the registered middleware was built with %q", built)
	}
}

// A custom provider serves the agent that names its model; the rest keep
// the worker's model.
func TestWorker_CustomModelProvider(t *testing.T) {
	echo := natsagent.ModelFunc(func(ctx context.Context, req *natsagent.GenerateRequest, onDelta func(natsagent.Delta)) (*natsagent.GenerateResponse, error) {
		text := "echo: " + req.Messages[len(req.Messages)-1].Content
		if onDelta != nil {
			onDelta(natsagent.Delta{Content: text})
		}
		return &natsagent.GenerateResponse{Message: natsagent.Message{Role: natsagent.RoleAssistant, Content: text}, FinishReason: natsagent.FinishStop}, nil
	})
	d := natsagenttest.Start(t, natsagent.Config{Agents: []natsagent.Agent{
		{Name: "parrot", Model: "echo-1", Provider: echo},
		{Name: "plain"},
	}}, natsagenttest.Text("from the scripted model"))
	res := d.Ask("t1", "parrot", "hello")
	natsagenttest.RequireStatus(t, res, natsagent.StatusSuccess)
	if res.Output() != "echo: hello" {
		t.Errorf("parrot answered %q", res.Output())
	}
	res = d.Ask("t2", "plain", "hello")
	if res.Output() != "from the scripted model" {
		t.Errorf("plain answered %q", res.Output())
	}
	if n := len(d.ModelRequests()); n != 1 {
		t.Errorf("the scripted model got %d requests, want 1", n)
	}
}

// Tool exclusion in Go removes a tool a middleware adds.
func TestWorker_ExcludeMiddlewareTool(t *testing.T) {
	d := natsagenttest.Start(t, natsagent.Config{Agents: []natsagent.Agent{{
		Name:         "lean",
		ToolNames:    []string{"current_time"},
		ExcludeTools: []string{"write_todos", "ask_clarification"},
		Disable:      []string{"title"},
	}}}, natsagenttest.Text("ok"))
	res := d.Ask("t1", "lean", "hi")
	natsagenttest.RequireStatus(t, res, natsagent.StatusSuccess)
	names := toolNames(d.ModelRequests()[0])
	if slices.Contains(names, "write_todos") || slices.Contains(names, "ask_clarification") || !slices.Contains(names, "current_time") {
		t.Errorf("tools offered %v", names)
	}
	natsagenttest.RequireNoEvent(t, res, "thread.titled")
}

func TestNewWorker_Errors(t *testing.T) {
	for name, cfg := range map[string]natsagent.Config{
		"unknown tool name":        {Agents: []natsagent.Agent{{Name: "a", ToolNames: []string{"no_such_tool"}}}},
		"exclusion typo":           {Agents: []natsagent.Agent{{Name: "a", ExcludeTools: []string{"write_todo"}}}},
		"provider without a name":  {Agents: []natsagent.Agent{{Name: "a", Provider: natsagent.ModelFunc(nil)}}},
		"agent defined twice":      {Agents: []natsagent.Agent{{Name: "a"}, {Name: "a"}}},
		"replace a required one":   {Agents: []natsagent.Agent{{Name: "a", Middleware: []natsagent.Middleware{named("tool_call_repair")}}}},
		"invalid YAML":             {ConfigYAML: []byte("agents: [")},
		"YAML names an unknown mw": {ConfigYAML: []byte("agents:\n  - name: x\n    middleware: {user: [{use: nope_mw}]}\n")},
		"two replicas":             {Replicas: 2},
		"invalid prefix":           {Prefix: "a.b"},
	} {
		t.Run(name, func(t *testing.T) {
			d := natsagenttest.Start(t, natsagent.Config{}, natsagenttest.Text("unused"))
			if _, err := natsagent.NewWorker(d.Conn, cfg); err == nil {
				t.Error("NewWorker accepted it")
			}
		})
	}
}

type named string

func (n named) Name() string { return string(n) }

// Config.Tools reach the stock chatbot; an agent of the configuration
// lists them by name.
func TestWorker_ToolsReachStockChatbot(t *testing.T) {
	d := natsagenttest.Start(t, natsagent.Config{Tools: []natsagent.Tool{addTool}},
		natsagenttest.ToolCall("add", `{"a":20,"b":22}`),
		natsagenttest.Text("42"),
	)
	res := d.Ask("t1", "", "add 20 and 22")
	natsagenttest.RequireStatus(t, res, natsagent.StatusSuccess)
	if names := toolNames(d.ModelRequests()[0]); !slices.Contains(names, "add") || !slices.Contains(names, "current_time") {
		t.Errorf("the chatbot was offered %v", names)
	}
	if last := d.ModelRequests()[1].LastMessage(); last.Content != "42" {
		t.Errorf("tool result %q", last.Content)
	}
}
