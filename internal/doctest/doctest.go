// Package doctest reads the repository's Markdown docs for the tests that
// hold them to the code (every metric, route, name and key listed). It
// owns finding a doc and cutting a section out of it, nothing else.
package doctest

import (
	"go/ast"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Section returns the text under heading (a whole line, such as
// "### 3.3 Endpoints") of the Markdown file at path, relative to the
// module's root, up to the next heading of the same or a higher level. A
// file or heading that is not there fails the test.
func Section(t testing.TB, path, heading string) string {
	t.Helper()
	text := File(t, path)
	_, section, ok := strings.Cut(text, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("%s has no %q section", path, heading)
	}
	level, _, _ := strings.Cut(heading, " ")
	// Never at #: a shell comment in a code block starts a line with it.
	for i := len(level); i >= 2; i-- {
		section, _, _ = strings.Cut(section, "\n"+strings.Repeat("#", i)+" ")
	}
	return section
}

// File returns the file at path, relative to the module's root.
func File(t testing.TB, path string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
	data, err := os.ReadFile(filepath.Join(dir, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// StringConsts returns the string constants (and variables) that files
// declare with a literal value, by name: what a test needs to read a
// call's argument that names one instead of spelling it.
func StringConsts(files ...*ast.File) map[string]string {
	consts := map[string]string{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			if vs, ok := n.(*ast.ValueSpec); ok {
				for i, id := range vs.Names {
					if i < len(vs.Values) {
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							consts[id.Name], _ = strconv.Unquote(lit.Value)
						}
					}
				}
			}
			return true
		})
	}
	return consts
}
