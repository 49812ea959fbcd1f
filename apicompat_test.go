package natsagent_test

import (
	"bufio"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/exp/apidiff"
	"golang.org/x/tools/go/gcexportdata"
	"golang.org/x/tools/go/packages"
)

// apiBase holds the export data of the public packages as released in
// v0.1.0 (CONTRIBUTING.md, "API compatibility"). TestAPICompatible compares
// the packages as they are now with it, as apidiff does, and fails on an
// incompatible change only: a removed or changed exported name, a method
// added to an interface users implement... Compatible additions are
// logged. A new v0.x release regenerates it from the tree being released:
//
//	NATSAGENT_UPDATE_API_BASE=1 go test -run TestAPICompatible .
//
// (NATSAGENT_API_BASE_DIR=<checkout> loads another checkout instead of
// this one, to write the base of an earlier commit.)
const apiBase = "testdata/api-v0.1.0"

var apiPackages = map[string]string{
	"github.com/natsagent/natsagent":               "natsagent.export",
	"github.com/natsagent/natsagent/natsagenttest": "natsagenttest.export",
}

func loadAPI(t *testing.T, dir string) map[string]*types.Package {
	t.Helper()
	cfg := &packages.Config{Mode: packages.NeedName | packages.NeedTypes, Dir: dir}
	var paths []string
	for p := range apiPackages {
		paths = append(paths, p)
	}
	pkgs, err := packages.Load(cfg, paths...)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*types.Package{}
	for _, p := range pkgs {
		for _, e := range p.Errors {
			t.Fatalf("%s: %v", p.PkgPath, e)
		}
		out[p.PkgPath] = p.Types
	}
	return out
}

func TestAPICompatible(t *testing.T) {
	if os.Getenv("NATSAGENT_UPDATE_API_BASE") == "1" {
		for path, pkg := range loadAPI(t, os.Getenv("NATSAGENT_API_BASE_DIR")) {
			f, err := os.Create(filepath.Join(apiBase, apiPackages[path]))
			if err != nil {
				t.Fatal(err)
			}
			w := bufio.NewWriter(f)
			if err := gcexportdata.Write(w, token.NewFileSet(), pkg); err != nil {
				t.Fatal(err)
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
		return
	}
	now := loadAPI(t, "")
	for path, file := range apiPackages {
		f, err := os.Open(filepath.Join(apiBase, file))
		if err != nil {
			t.Fatalf("%v: the API base is missing (CONTRIBUTING.md, \"API compatibility\")", err)
		}
		r, err := gcexportdata.NewReader(bufio.NewReader(f))
		if err != nil {
			t.Fatal(err)
		}
		old, err := gcexportdata.Read(r, token.NewFileSet(), map[string]*types.Package{}, path)
		f.Close()
		if err != nil {
			t.Fatalf("read %s: %v", file, err)
		}
		// An empty base would prove nothing.
		if n := len(old.Scope().Names()); n < 10 {
			t.Fatalf("%s holds %d exported names of %s", file, n, path)
		}
		report := apidiff.Changes(old, now[path])
		for _, c := range report.Changes {
			if c.Compatible {
				t.Logf("%s: compatible: %s", path, c.Message)
				continue
			}
			t.Errorf("%s: incompatible with v0.1.0: %s", path, c.Message)
		}
	}
}

// The check tells a breaking change from an addition: the v0.1.0 base
// of the root package compared with itself less one exported name is
// incompatible, and with itself plus one is compatible.
func TestAPICompatibleTellsBreakingFromAdded(t *testing.T) {
	const path = "github.com/natsagent/natsagent"
	read := func() *types.Package {
		f, err := os.Open(filepath.Join(apiBase, apiPackages[path]))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		r, err := gcexportdata.NewReader(bufio.NewReader(f))
		if err != nil {
			t.Fatal(err)
		}
		p, err := gcexportdata.Read(r, token.NewFileSet(), map[string]*types.Package{}, path)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := read()
	// A package with every name of the base but NewClient.
	removed := types.NewPackage(path, base.Name())
	for _, n := range base.Scope().Names() {
		if n != "NewClient" {
			removed.Scope().Insert(base.Scope().Lookup(n))
		}
	}
	removed.MarkComplete()
	var incompatible int
	for _, c := range apidiff.Changes(base, removed).Changes {
		if !c.Compatible {
			incompatible++
		}
	}
	if incompatible != 1 {
		t.Errorf("removing NewClient: %d incompatible changes, want 1", incompatible)
	}
	added := types.NewPackage(path, base.Name())
	for _, n := range base.Scope().Names() {
		added.Scope().Insert(base.Scope().Lookup(n))
	}
	added.Scope().Insert(types.NewConst(token.NoPos, added, "Extra", types.Typ[types.Int], nil))
	added.MarkComplete()
	for _, c := range apidiff.Changes(base, added).Changes {
		if !c.Compatible {
			t.Errorf("adding a constant is called incompatible: %s", c.Message)
		}
	}
}
