package bus

import "testing"

func TestSubagentSubjects(t *testing.T) {
	n := Names{Prefix: "p1"}
	if got := n.SubagentSubject("acme", "start"); got != "p1.subagent.acme.start" {
		t.Errorf("SubagentSubject = %s", got)
	}
	if got := n.SubagentEndpoint("await"); got != "p1.subagent.*.await" {
		t.Errorf("SubagentEndpoint = %s", got)
	}
	for subject, want := range map[string][3]string{
		"p1.subagent.acme.status":   {"acme", "status", "ok"},
		"p1.subagent.acme.x.status": {"", "", ""},
		"p1.subagent.acme":          {"", "", ""},
		"p2.subagent.acme.status":   {"", "", ""},
	} {
		tenant, op, ok := n.ParseSubagentSubject(subject)
		if tenant != want[0] || op != want[1] || ok != (want[2] == "ok") {
			t.Errorf("ParseSubagentSubject(%s) = %s %s %v", subject, tenant, op, ok)
		}
	}
}
