package gateway

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/doctest"
)

// Every route the gateway registers is a row of docs/protocol.md's endpoint
// table (3.3), and every row is a route it registers.
func TestEveryRouteDocumented(t *testing.T) {
	section := doctest.Section(t, "docs/protocol.md", "### 3.3 Endpoints")
	documented := map[string]bool{}
	// A row opens with `METHOD /path`, or `GET` or `POST /path`; a path
	// may end in an optional [/{segment}].
	row := regexp.MustCompile("(?m)^\\| `([A-Z]+)(?:` or `([A-Z]+))? (/[^`]*)`")
	for _, m := range row.FindAllStringSubmatch(section, -1) {
		paths := []string{m[3]}
		if head, opt, ok := strings.Cut(m[3], "["); ok {
			paths = []string{head, head + strings.TrimSuffix(opt, "]")}
		}
		for _, method := range []string{m[1], m[2]} {
			for _, p := range paths {
				if method != "" {
					documented[method+" "+p] = true
				}
			}
		}
	}

	registered := registeredRoutes(t)
	for _, must := range []string{"GET /healthz", "POST /threads/{thread_id}/runs/stream", "GET /console/{path}"} {
		if !slices.Contains(registered, must) {
			t.Fatalf("the scan missed %s (found %v): it no longer reads the code right", must, registered)
		}
	}
	for _, r := range registered {
		if !documented[r] {
			t.Errorf("%s is registered but not a row of docs/protocol.md 3.3", r)
		}
		delete(documented, r)
	}
	for r := range documented {
		t.Errorf("docs/protocol.md 3.3 has a row for %s, which the gateway does not register", r)
	}
}

// registeredRoutes lists the patterns given to Handle and HandleFunc in the
// package's non-test files, string literals or its string constants, as
// the doc writes them: {name...} is {name}, and /{$} is /.
func registeredRoutes(t *testing.T) []string {
	t.Helper()
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var parsed []*ast.File
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, f)
	}
	consts := doctest.StringConsts(parsed...)
	var out []string
	for _, f := range parsed {
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Handle" && sel.Sel.Name != "HandleFunc" {
				return true
			}
			var pattern string
			switch a := call.Args[0].(type) {
			case *ast.BasicLit:
				pattern, _ = strconv.Unquote(a.Value)
			case *ast.Ident:
				pattern = consts[a.Name]
			}
			if pattern == "" {
				t.Errorf("%s: a route whose pattern the scan cannot read", fset.Position(call.Pos()))
				return true
			}
			pattern = strings.ReplaceAll(pattern, "...}", "}")
			pattern = strings.TrimSuffix(pattern, "{$}")
			out = append(out, pattern)
			return true
		})
	}
	slices.Sort(out)
	return out
}
