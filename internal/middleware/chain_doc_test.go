package middleware

import (
	"regexp"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/doctest"
)

// docs/middleware.md's table of the default lead chain has a row for every
// built-in middleware of that chain, and no other; the ones a profile adds
// to its user segment are described after it.
func TestMiddlewareDocListsEveryBuiltin(t *testing.T) {
	section := doctest.Section(t, "docs/middleware.md", "## The default lead chain")
	rows := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| (?:[0-9]+|–) \\| `([a-z_]+)`").FindAllStringSubmatch(section, -1) {
		rows[m[1]] = true
	}
	for _, b := range Builtins() {
		switch {
		case b.UserOnly && !strings.Contains(section, "`"+b.Name+"`"):
			t.Errorf("%s (user segment only) is not described in docs/middleware.md's default lead chain section", b.Name)
		case !b.UserOnly && !rows[b.Name]:
			t.Errorf("%s is a built-in middleware without a row in docs/middleware.md's default lead chain", b.Name)
		}
		delete(rows, b.Name)
	}
	for name := range rows {
		t.Errorf("docs/middleware.md's default lead chain has a row for %s, which is not a built-in middleware", name)
	}
}
