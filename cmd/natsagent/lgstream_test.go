package main

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"
)

// lgPart is one line of --stream-mode --json.
type lgPart struct {
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
}

func decodeParts(t *testing.T, out string) []lgPart {
	t.Helper()
	var parts []lgPart
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var p lgPart
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		parts = append(parts, p)
	}
	return parts
}

// lgValues is a values part as a LangGraph client reads it.
type lgValues struct {
	Messages []struct {
		Type    string `json:"type"`
		Content string `json:"content"`
		ID      string `json:"id"`
	} `json:"messages"`
}

func (v lgValues) transcript() string {
	var out []string
	for _, m := range v.Messages {
		out = append(out, m.Type+":"+m.Content)
	}
	return strings.Join(out, ",")
}

// run and tail print a run in LangGraph's stream modes through the
// gateway's translator: metadata first, the answer's chunks in
// messages-tuple (LangChain's AIMessageChunk, node "model"), the values
// after each step in LangChain's message shape, updates per node, end;
// SSE by default. A failed run sends error and exits 1; a mode that does
// not exist, or a thread's tail, is a usage error.
func TestStreamModes(t *testing.T) {
	e := newCLIEnv(t, scriptModel())
	r := e.cli("run", "--thread", "t1", "--run-id", "r1", "--stream-mode", "values,messages-tuple", "--json", "hello").must(t, 0)
	parts := decodeParts(t, r.out)
	if len(parts) < 4 || parts[0].Event != "metadata" || parts[len(parts)-1].Event != "end" {
		t.Fatalf("parts %s", r.out)
	}
	var meta struct {
		RunID    string `json:"run_id"`
		ThreadID string `json:"thread_id"`
	}
	if json.Unmarshal(parts[0].Data, &meta) != nil || meta.RunID != "r1" || meta.ThreadID != "t1" {
		t.Fatalf("metadata %s", parts[0].Data)
	}
	chunks, last := "", lgValues{}
	for _, p := range parts {
		switch p.Event {
		case "messages":
			var tuple []json.RawMessage
			var c struct {
				Type    string `json:"type"`
				Content string `json:"content"`
			}
			var m struct {
				Node string `json:"langgraph_node"`
			}
			if json.Unmarshal(p.Data, &tuple) != nil || len(tuple) != 2 || json.Unmarshal(tuple[0], &c) != nil || json.Unmarshal(tuple[1], &m) != nil ||
				c.Type != "AIMessageChunk" || m.Node != "model" {
				t.Fatalf("messages part %s", p.Data)
			}
			chunks += c.Content
		case "values":
			last = lgValues{}
			if err := json.Unmarshal(p.Data, &last); err != nil {
				t.Fatal(err)
			}
		case "metadata", "end":
		default:
			t.Fatalf("a part of a mode not asked for: %s", p.Event)
		}
	}
	if chunks != "echo: hello" {
		t.Fatalf("the chunks make %q", chunks)
	}
	if got := last.transcript(); got != "human:hello,ai:echo: hello" {
		t.Fatalf("the last values %s", got)
	}

	// tail replays the finished run from its start, in SSE; updates name
	// the node.
	r = e.cli("tail", "--run", "r1", "--stream-mode", "updates").must(t, 0)
	r.has(t, "event: metadata\ndata: {", "event: updates\ndata: {\"model\":{\"messages\":[{", `"content":"echo: hello"`, "event: end\n")
	if strings.Contains(r.out, "event: values") {
		t.Fatalf("values sent without being asked for:\n%s", r.out)
	}

	// A second run on the thread: its first values hold the thread's
	// messages before it with its input.
	r = e.cli("run", "--thread", "t1", "--stream-mode", "values", "--json", "again").must(t, 0)
	var first lgValues
	for _, p := range decodeParts(t, r.out) {
		if p.Event == "values" {
			if err := json.Unmarshal(p.Data, &first); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if got := first.transcript(); got != "human:hello,ai:echo: hello,human:again" {
		t.Fatalf("the first values of the second run: %s", got)
	}

	r = e.cli("run", "--agent", "nope", "--stream-mode", "values", "hi").must(t, 1)
	r.has(t, "event: error\ndata: {\"error\":\"RunError\"", "event: end\n")
	e.cli("run", "--stream-mode", "nope", "hi").must(t, 2).says(t, `stream mode "nope"`)
	e.cli("tail", "--thread", "t1", "--stream-mode", "values").must(t, 2).says(t, "--run")
}
