package middleware

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/tools"
)

// searchRuntime is a run whose tools are eight deferred MCP-style tools
// and one ordinary one.
func searchRuntime(t *testing.T) *Runtime {
	t.Helper()
	specs := []model.ToolSpec{
		{Name: "github__create_issue", Description: "Create an issue in a GitHub repository."},
		{Name: "github__list_issues", Description: "List the issues of a repository, issue by issue."},
		{Name: "github__close_issue", Description: "Close an issue."},
		{Name: "jira__create_ticket", Description: "Create a ticket (an issue, in Jira terms)."},
		{Name: "jira__search", Description: "Search Jira with JQL."},
		{Name: "slack__post_message", Description: "Post a message to a channel."},
		{Name: "slack__list_channels", Description: "List channels."},
		{Name: "fmt__format", Description: "Formats C++ code."},
		{Name: "current_time", Description: "Returns the current time, issue free."},
	}
	var ts []tools.Tool
	for _, s := range specs {
		s.Parameters = json.RawMessage(`{"type":"object"}`)
		ts = append(ts, tools.Func(s, func(context.Context, json.RawMessage) (string, error) { return "ok", nil }))
	}
	set, err := tools.NewSet(ts...)
	if err != nil {
		t.Fatal(err)
	}
	return &Runtime{Tools: set}
}

func TestToolSearchQueryForms(t *testing.T) {
	ts, err := NewToolSearch(ToolSearch{})
	if err != nil {
		t.Fatal(err)
	}
	rt := searchRuntime(t)
	c := ts.catalog(rt)
	if len(c.names) != 8 || slices.Contains(c.names, "current_time") {
		t.Fatalf("deferred %v, want the eight tools with __ in their names", c.names)
	}
	cases := []struct {
		query string
		want  []string
		notes []string
	}{
		// select: exact names, in the order asked, without the cap of 5
		// (deer-flow #4054); unknown and ordinary tools get a note.
		{"select:slack__list_channels,github__create_issue,github__list_issues,github__close_issue,jira__create_ticket,jira__search, slack__post_message,nope,current_time,github__create_issue",
			[]string{"slack__list_channels", "github__create_issue", "github__list_issues", "github__close_issue", "jira__create_ticket", "jira__search", "slack__post_message"},
			[]string{"nope: no such deferred tool", "current_time is not deferred"}},
		// +required: only names containing "jira", ranked by "create".
		{"+jira create", []string{"jira__create_ticket", "jira__search"}, nil},
		{"+JIRA +search", []string{"jira__search"}, nil},
		// Regex: name hits (2) above description-only hits (1); the tie
		// between name hits is broken by name.
		{"issue", []string{"github__close_issue", "github__create_issue", "github__list_issues", "jira__create_ticket"}, nil},
		{"^slack__(post|list)", []string{"slack__list_channels", "slack__post_message"}, nil},
		// An invalid regex is matched as literal text.
		{"c++", []string{"fmt__format"}, nil},
		{"(unclosed", nil, nil},
		// Capped at max_results.
		{".", []string{"fmt__format", "github__close_issue", "github__create_issue", "github__list_issues", "jira__create_ticket"}, nil},
	}
	for _, tc := range cases {
		found, notes := ts.search(rt, c, tc.query)
		if !slices.Equal(found, tc.want) {
			t.Errorf("%q found %v, want %v", tc.query, found, tc.want)
		}
		if len(notes) != len(tc.notes) {
			t.Errorf("%q notes %q, want %q", tc.query, notes, tc.notes)
			continue
		}
		for i, n := range tc.notes {
			if !strings.Contains(notes[i], n) {
				t.Errorf("%q note %d = %q, want %q", tc.query, i, notes[i], n)
			}
		}
	}

	small, _ := NewToolSearch(ToolSearch{MaxResults: 2})
	if found, _ := small.search(rt, c, "."); len(found) != 2 {
		t.Fatalf("max_results 2 returned %v", found)
	}
	if found, _ := small.search(rt, c, "select:jira__search,jira__create_ticket,fmt__format"); len(found) != 3 {
		t.Fatalf("select is capped: %v", found)
	}
}

func TestToolSearchDeferredPatterns(t *testing.T) {
	ts, err := NewToolSearch(ToolSearch{Deferred: []string{"slack__*", "current_time"}})
	if err != nil {
		t.Fatal(err)
	}
	c := ts.catalog(searchRuntime(t))
	if want := []string{"current_time", "slack__list_channels", "slack__post_message"}; !slices.Equal(c.names, want) {
		t.Fatalf("deferred %v, want %v", c.names, want)
	}
	for _, bad := range []ToolSearch{{Deferred: []string{"[a"}}, {Deferred: []string{" "}}, {MaxResults: 51}, {MaxResults: -1}, {AutoPromoteTopK: -1}, {AutoPromoteTopK: 21}} {
		if _, err := NewToolSearch(bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// The catalog hash covers names and schemas and ignores the key order
// of a schema.
func TestCatalogHash(t *testing.T) {
	specs := map[string]model.ToolSpec{
		"a__x": {Name: "a__x", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)},
	}
	h := catalogHash([]string{"a__x"}, specs)
	specs["a__x"] = model.ToolSpec{Name: "a__x", Parameters: json.RawMessage(`{ "properties":{}, "type":"object"}`)}
	if catalogHash([]string{"a__x"}, specs) != h {
		t.Fatal("key order changed the hash")
	}
	specs["a__x"] = model.ToolSpec{Name: "a__x", Parameters: json.RawMessage(`{"type":"object","properties":{"n":{"type":"integer"}}}`)}
	if catalogHash([]string{"a__x"}, specs) == h {
		t.Fatal("a changed schema kept the hash")
	}
	renamed := map[string]model.ToolSpec{"a__y": {Name: "a__y", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)}}
	if catalogHash([]string{"a__y"}, renamed) == h {
		t.Fatal("a renamed tool kept the hash")
	}
}

func TestAutoPromoteRanksByWords(t *testing.T) {
	ts, _ := NewToolSearch(ToolSearch{AutoPromoteTopK: 2})
	c := ts.catalog(searchRuntime(t))
	got := ts.autoPromote(c, "Please open a GitHub issue about the crash, and create it today")
	if want := []string{"github__create_issue", "github__close_issue"}; !slices.Equal(got, want) {
		t.Fatalf("auto-promoted %v, want %v", got, want)
	}
	if got := ts.autoPromote(c, "hello there"); len(got) != 0 {
		t.Fatalf("auto-promoted %v for an unrelated message", got)
	}
}
