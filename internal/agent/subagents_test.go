package agent

import (
	"errors"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/middleware"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
	"github.com/natsagent/natsagent/internal/tools"
)

func TestSubagentCatalog(t *testing.T) {
	m := model.NewFixed(model.Reply{Text: "ok"})
	sub := func(name string) Profile {
		return Profile{Name: name, Kind: middleware.KindSubagent, Description: name + " does things"}
	}
	lead := func(name string, subs []string) Profile { return Profile{Name: name, Subagents: subs} }

	a, err := NewAgents(m, tools.NewRegistry(), lead("all", nil), lead("some", []string{"coder"}), lead("none", []string{}), sub("researcher"), sub("coder"))
	if err != nil {
		t.Fatal(err)
	}
	names := func(lead string) string {
		var out []string
		for _, s := range a.Subagents(lead) {
			out = append(out, s.Name)
		}
		return strings.Join(out, ",")
	}
	if got := names("all"); got != "coder,researcher" {
		t.Errorf("all: %s", got)
	}
	if got := names("some"); got != "coder" {
		t.Errorf("some: %s", got)
	}
	if got := names("none") + names("coder"); got != "" {
		t.Errorf("none and a subagent: %q", got)
	}
	if ok, _ := a.MaySpawn("some", "researcher"); ok {
		t.Error("some may start researcher")
	}
	if ok, allowed := a.MaySpawn("all", "researcher"); !ok || len(allowed) != 2 {
		t.Errorf("all: %v %v", ok, allowed)
	}

	for _, bad := range [][]Profile{
		{lead("l", []string{"ghost"}), sub("researcher")},
		{lead("l", []string{"other"}), lead("other", nil)},
		{lead("l", nil), func() Profile { p := sub("s"); p.Subagents = []string{"s"}; return p }()},
	} {
		if _, err := NewAgents(m, tools.NewRegistry(), bad...); err == nil || !strings.Contains(err.Error(), "subagents") {
			t.Errorf("profiles %+v: %v", bad, err)
		}
	}

	// A run with a parent must name a subagent profile: a lead as a child
	// would nest subagents.
	req := &protocol.RunRequest{RunID: "r", ThreadID: "h", Agent: "all", Parent: &protocol.Parent{RunID: "p", ThreadID: "ph", ToolCallID: "c"}}
	if _, err := a.Prepare(req); err == nil || errors.Is(err, ErrUnknownAgent) {
		t.Errorf("a lead prepared as a child: %v", err)
	}
	req.Agent = "researcher"
	if _, err := a.Prepare(req); err != nil {
		t.Errorf("a subagent child: %v", err)
	}
}
