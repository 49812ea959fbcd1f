package mcptools

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/tools"
)

// MaxNameLen is the longest tool name model providers accept.
const MaxNameLen = 64

// Tool is one tool of an MCP server.
type Tool struct {
	server *server
	// remote is the server's name for the tool, name the model's.
	remote string
	name   string
	spec   model.ToolSpec
}

func newTool(s *server, t *mcp.Tool) (*Tool, error) {
	params := json.RawMessage(`{"type":"object","properties":{}}`)
	if t.InputSchema != nil {
		raw, err := json.Marshal(t.InputSchema)
		if err != nil {
			return nil, fmt.Errorf("input schema: %w", err)
		}
		params = raw
	}
	desc := t.Description
	if desc == "" {
		desc = cmp.Or(t.Title, t.Name) + " (a tool of MCP server " + s.cfg.Name + ")"
	}
	name := Name(s.cfg.Name, t.Name)
	return &Tool{server: s, remote: t.Name, name: name, spec: model.ToolSpec{Name: name, Description: desc, Parameters: params}}, nil
}

// Name is the name the model sees for a server's tool: "<server>__<tool>",
// every character outside [A-Za-z0-9_-] replaced by '_', cut to
// MaxNameLen.
func Name(server, tool string) string {
	var b strings.Builder
	b.WriteString(server)
	b.WriteString(Separator)
	for _, r := range tool {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	name := b.String()
	if len(name) > MaxNameLen {
		name = name[:MaxNameLen]
	}
	return name
}

// Spec implements tools.Tool.
func (t *Tool) Spec() model.ToolSpec { return t.spec }

// Call implements tools.Tool: one tools/call to the server, bounded by the
// server's timeout and by ctx (a cancelled run cancels the call). Whatever
// goes wrong with the server is an error result the model reads; only the
// end of the run itself returns an error.
func (t *Tool) Call(ctx context.Context, call *tools.Call) (*tools.Result, error) {
	s := t.server
	callCtx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	args := call.Args
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	params := &mcp.CallToolParams{Name: t.remote, Arguments: args}
	var res *mcp.CallToolResult
	var err error
	// A call the server never received is sent once more on a new
	// session (an http server that restarted and forgot the session); a
	// call it may have received never is: it may have had effects.
	for attempt := 0; attempt < 2; attempt++ {
		var c *session
		c, err = s.session(callCtx)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return nil, context.Cause(ctx)
			case callCtx.Err() != nil:
				return failed("MCP server %q could not be reached within %s; try again later or do without %s.", s.cfg.Name, s.timeout, t.name), nil
			}
			return failed("MCP server %q is unavailable: %v", s.cfg.Name, err), nil
		}
		res, err = c.cs.CallTool(callCtx, params)
		if err == nil {
			return result(res), nil
		}
		switch {
		case ctx.Err() != nil:
			return nil, context.Cause(ctx)
		case callCtx.Err() != nil:
			s.probe(c)
			return failed("%s did not finish within %s and was cancelled.", t.name, s.timeout), nil
		}
		switch classify(err) {
		case answered:
			return failed("MCP server %q refused the call: %v", s.cfg.Name, err), nil
		case undelivered:
			s.drop(c, err)
			continue
		}
		s.drop(c, err)
		return failed("MCP server %q: the connection failed during the call (%v); whether %s ran is unknown. The server is reconnected for the next call.", s.cfg.Name, err, t.name), nil
	}
	return failed("MCP server %q is unavailable: %v", s.cfg.Name, err), nil
}

// What a failed call says about the server.
const (
	// answered: the server sent a JSON-RPC error; the session is fine.
	answered = iota
	// undelivered: the request never reached the server.
	undelivered
	// broken: the connection failed; the request may have been handled.
	broken
)

// JSON-RPC codes the SDK uses for its own transport failures.
const (
	codeClientClosing = -32003
	codeServerClosing = -32004
	codeRejected      = -32005
)

func classify(err error) int {
	if errors.Is(err, mcp.ErrSessionMissing) {
		return undelivered
	}
	var we *jsonrpc.Error
	if !errors.As(err, &we) {
		return broken
	}
	switch we.Code {
	case codeRejected:
		return undelivered
	case codeClientClosing, codeServerClosing:
		return broken
	}
	return answered
}

func failed(format string, args ...any) *tools.Result {
	return &tools.Result{Content: fmt.Sprintf(format, args...), Error: true}
}

// result renders a tool result as text for the model: text content as it
// is, anything else summarized in brackets; structured content when there
// is nothing else.
func result(res *mcp.CallToolResult) *tools.Result {
	parts := make([]string, 0, len(res.Content))
	for _, c := range res.Content {
		parts = append(parts, render(c))
	}
	if len(parts) == 0 && res.StructuredContent != nil {
		if raw, err := json.Marshal(res.StructuredContent); err == nil {
			parts = append(parts, string(raw))
		}
	}
	out := strings.Join(parts, "\n")
	if out == "" {
		out = "The tool returned no content."
		if res.IsError {
			out = "The tool reported an error without a message."
		}
	}
	return &tools.Result{Content: out, Error: res.IsError}
}

func render(c mcp.Content) string {
	switch c := c.(type) {
	case *mcp.TextContent:
		return c.Text
	case *mcp.ImageContent:
		return fmt.Sprintf("[image %s, %d bytes]", orUnknown(c.MIMEType), len(c.Data))
	case *mcp.AudioContent:
		return fmt.Sprintf("[audio %s, %d bytes]", orUnknown(c.MIMEType), len(c.Data))
	case *mcp.ResourceLink:
		return fmt.Sprintf("[resource link %q: %s]", c.Name, c.URI)
	case *mcp.EmbeddedResource:
		r := c.Resource
		switch {
		case r == nil:
			return "[resource]"
		case r.Blob == nil:
			return fmt.Sprintf("[resource %s]\n%s", r.URI, r.Text)
		}
		return fmt.Sprintf("[resource %s, %s, %d bytes]", r.URI, orUnknown(r.MIMEType), len(r.Blob))
	}
	return fmt.Sprintf("[%T content]", c)
}

func orUnknown(mime string) string {
	if mime == "" {
		return "of unknown type"
	}
	return mime
}

func joinSorted(set map[string]bool) string {
	if len(set) == 0 {
		return "no tools"
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
