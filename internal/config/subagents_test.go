package config

import "testing"

// A lead's subagents list: absent means every subagent profile, [] none.
func TestAgentSubagentsList(t *testing.T) {
	cfg, err := Load(writeConfig(t, `
agents:
  - name: all
  - name: none
    subagents: []
  - name: some
    subagents: [researcher]
  - name: researcher
    kind: subagent
    description: Finds facts.
`))
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Agents
	if a[0].Subagents != nil || a[1].Subagents == nil || len(a[1].Subagents) != 0 || len(a[2].Subagents) != 1 || a[3].Kind != "subagent" {
		t.Errorf("agents %+v", a)
	}
}
