package natsagent_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Clients read the wire, not the engine: the gateway, the CLI and the
// wire half of compaction must not depend on the worker's chain. The
// gateway's whole dependency graph is checked; the CLI's own imports are
// (its bench and soak commands run workers in-process on purpose), and
// TestCLIClientCommandsUseThePublicClient checks its client commands.
func TestClientsDependOnTheWireOnly(t *testing.T) {
	engine := []string{"internal/middleware", "internal/agent", "internal/worker"}
	check := func(what string, args ...string) {
		t.Helper()
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		pkgs := strings.Fields(string(out))
		if len(pkgs) < 3 {
			t.Fatalf("go %s listed %d packages: %s", strings.Join(args, " "), len(pkgs), out)
		}
		for _, p := range pkgs {
			for _, e := range engine {
				if strings.HasSuffix(p, "/"+e) {
					t.Errorf("%s depends on %s", what, p)
				}
			}
		}
	}
	check("internal/gateway", "list", "-deps", "./internal/gateway")
	check("internal/compact", "list", "-deps", "./internal/compact")
	check("cmd/natsagent", "list", "-f", `{{join .Imports "\n"}}`, "./cmd/natsagent")
}

// operatorFiles are the files of cmd/natsagent whose commands are not
// client actions: they run workers in-process (bench, soak), manage NATS
// accounts and JWTs (jwt, tenant) or erase a user with the service
// account's JetStream access (users). They may import the engine and the
// stores; every other file is a client command.
var operatorFiles = []string{"bench.go", "soak.go", "jwt.go", "tenant.go", "users.go"}

// The CLI's client commands go through the public natsagent.Client: no
// file of cmd/natsagent but the operator files imports, directly or
// through another internal package, the stores (internal/kv), the submit
// path (internal/submit), the wiring of the binaries (internal/app) or
// the engine. A new file is a client command unless listed above.
func TestCLIClientCommandsUseThePublicClient(t *testing.T) {
	const module = "github.com/natsagent/natsagent"
	forbidden := []string{"internal/kv", "internal/submit", "internal/app", "internal/middleware", "internal/agent", "internal/worker", "internal/erase"}
	bad := func(p string) string {
		for _, f := range forbidden {
			if p == module+"/"+f {
				return f
			}
		}
		return ""
	}
	files, err := filepath.Glob("cmd/natsagent/*.go")
	if err != nil {
		t.Fatal(err)
	}
	byFile := map[string][]string{}
	var pkgs []string
	fset := token.NewFileSet()
	for _, path := range files {
		name := filepath.Base(path)
		if strings.HasSuffix(name, "_test.go") || slices.Contains(operatorFiles, name) {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, is := range f.Imports {
			p, _ := strconv.Unquote(is.Path.Value)
			if f := bad(p); f != "" {
				t.Errorf("cmd/natsagent/%s imports %s: a client command goes through natsagent.Client", name, f)
			}
			// The public package reads KV itself, behind its API.
			if strings.HasPrefix(p, module+"/internal/") {
				byFile[name] = append(byFile[name], p)
				if !slices.Contains(pkgs, p) {
					pkgs = append(pkgs, p)
				}
			}
		}
	}
	if len(byFile) < 10 {
		t.Fatalf("only %d client command files found in cmd/natsagent: %v", len(byFile), byFile)
	}
	out, err := exec.Command("go", append([]string{"list", "-deps", "-f", `{{.ImportPath}}: {{join .Deps " "}}`}, pkgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		p, rest, _ := strings.Cut(line, ": ")
		deps[p] = strings.Fields(rest)
	}
	for name, imports := range byFile {
		for _, p := range imports {
			for _, d := range deps[p] {
				if f := bad(d); f != "" {
					t.Errorf("cmd/natsagent/%s imports %s, which depends on %s: a client command goes through natsagent.Client", name, p, f)
				}
			}
		}
	}
}

// cmd/worker and the --dev workers of cmd/gateway are users of the public
// natsagent.Worker, as any program's main would be: neither imports the
// engine (the worker, the agents, the chain) directly, and of the wiring
// in internal/app cmd/worker uses only the command-line plumbing the
// public API has no business exposing (flags and --print-config, the NATS
// connection from the configuration, the logger, the GC target).
func TestWorkerCommandsUseThePublicWorker(t *testing.T) {
	const module = "github.com/natsagent/natsagent"
	engine := []string{"internal/worker", "internal/agent", "internal/tools", "internal/jobs"}
	for _, cmd := range []string{"./cmd/worker", "./cmd/gateway"} {
		out, err := exec.Command("go", "list", "-deps", "-f", `{{if eq .ImportPath "`+module+strings.TrimPrefix(cmd, ".")+`"}}{{join .Imports "\n"}}{{end}}`, cmd).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", cmd, err, out)
		}
		imports := strings.Fields(string(out))
		if !slices.Contains(imports, module) {
			t.Errorf("%s does not import the public package; its imports: %v", cmd, imports)
		}
		for _, p := range imports {
			for _, e := range engine {
				if p == module+"/"+e {
					t.Errorf("%s imports %s: its workers are natsagent.Workers", cmd, e)
				}
			}
		}
	}

	allowed := []string{"RegisterFlags", "Logger", "ApplyGC", "Connect"}
	files, err := filepath.Glob("cmd/worker/*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	used := 0
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		name := ""
		for _, is := range f.Imports {
			if p, _ := strconv.Unquote(is.Path.Value); p == module+"/internal/app" {
				name = "app"
				if is.Name != nil {
					name = is.Name.Name
				}
			}
		}
		if name == "" {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == name {
				used++
				if !slices.Contains(allowed, sel.Sel.Name) {
					t.Errorf("%s: app.%s: cmd/worker builds its worker with natsagent.NewWorker, not from internal/app", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
	if used == 0 {
		t.Fatal("no use of internal/app found in cmd/worker: the check looks at nothing")
	}
}
