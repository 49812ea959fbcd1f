package app

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/doctest"
)

// envReaders are the calls whose first argument names an environment
// variable a binary reads: the os functions, the CLI's envOr, and the
// get of config's applyEnv (config.Load passes os.Getenv).
var envReaders = map[string]bool{"os.Getenv": true, "os.LookupEnv": true, "envOr": true, "get": true}

// envHelpers are packages whose variables only tests set (re-running the
// test binary as a command, the sandbox suite's switch).
var envHelpers = []string{"internal/testdeploy", "internal/natstest", "internal/sandbox/sandboxtest"}

// Every environment variable the binaries read, found in the code as the
// name passed to os.Getenv, os.LookupEnv and the helpers that wrap them, is
// in docs/configuration.md's Environment section.
func TestEveryEnvironmentVariableDocumented(t *testing.T) {
	section := doctest.Section(t, "docs/configuration.md", "## Environment")
	names := envNamesInCode(t, filepath.Join("..", ".."))
	for _, must := range []string{"OPENAI_API_KEY", "NATS_URL", "NATSAGENT_CONFIG"} {
		if !slices.Contains(names, must) {
			t.Fatalf("the scan missed %s (found %v): it no longer reads the code right", must, names)
		}
	}
	for _, name := range names {
		if !strings.Contains(section, "`"+name+"`") && !strings.Contains(section, "`"+name+"=") {
			t.Errorf("%s is read by the code but not in docs/configuration.md's Environment section", name)
		}
	}
}

// envNamesInCode lists the variable names the non-test Go files under
// root's cmd and internal read: string literals and the string constants
// of the same package given to an envReaders call.
func envNamesInCode(t *testing.T, root string) []string {
	t.Helper()
	fset := token.NewFileSet()
	pkgs := map[string][]*ast.File{}
	for _, top := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			if d.IsDir() {
				if slices.Contains(envHelpers, filepath.ToSlash(rel)) || d.Name() == "testdata" {
					return filepath.SkipDir
				}
				return nil
			}
			if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			pkgs[filepath.Dir(path)] = append(pkgs[filepath.Dir(path)], f)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	for _, files := range pkgs {
		consts := doctest.StringConsts(files...)
		for _, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || len(call.Args) == 0 {
					return true
				}
				var callee string
				switch fn := call.Fun.(type) {
				case *ast.Ident:
					callee = fn.Name
				case *ast.SelectorExpr:
					if x, ok := fn.X.(*ast.Ident); ok {
						callee = x.Name + "." + fn.Sel.Name
					}
				}
				if !envReaders[callee] {
					return true
				}
				switch a := call.Args[0].(type) {
				case *ast.BasicLit:
					if v, err := strconv.Unquote(a.Value); err == nil {
						seen[v] = true
					}
				case *ast.Ident:
					if v, ok := consts[a.Name]; ok {
						seen[v] = true
					}
				}
				return true
			})
		}
	}
	var out []string
	for name := range seen {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}
