package bus

import "testing"

// The run, submit and subagent parsers accept exactly P.<kind>.<a>.<b> of
// their own kind and prefix, and nothing another kind or a longer or
// shorter subject would make them read.
func TestParsePairSubjects(t *testing.T) {
	n := Names{Prefix: "p1"}
	parsers := map[string]func(string) (string, string, bool){
		"runs":     n.ParseRunSubject,
		"submit":   n.ParseSubmitSubject,
		"subagent": n.ParseSubagentSubject,
	}
	for kind, parse := range parsers {
		if a, b, ok := parse("p1." + kind + ".acme.t1"); !ok || a != "acme" || b != "t1" {
			t.Errorf("%s: p1.%s.acme.t1 parses as %q %q %v", kind, kind, a, b, ok)
		}
		for _, bad := range []string{
			"p1." + kind + ".acme.t1.x",
			"p1." + kind + ".acme",
			"p2." + kind + ".acme.t1",
			"p1." + kind + "x.acme.t1",
			"x.p1." + kind + ".acme.t1",
		} {
			if a, b, ok := parse(bad); ok || a != "" || b != "" {
				t.Errorf("%s: %s parses as %q %q %v", kind, bad, a, b, ok)
			}
		}
		for other := range parsers {
			if other == kind {
				continue
			}
			if _, _, ok := parse("p1." + other + ".acme.t1"); ok {
				t.Errorf("%s: accepted a %s subject", kind, other)
			}
		}
	}
}
