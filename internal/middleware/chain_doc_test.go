package middleware

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// docs/middleware.md's table of the default lead chain has a row for every
// built-in middleware of that chain, and no other; the ones a profile adds
// to its user segment are described after it.
func TestMiddlewareDocListsEveryBuiltin(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "middleware.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## The default lead chain\n")
	if !ok {
		t.Fatal(`docs/middleware.md has no "## The default lead chain" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
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
