package natsagent_test

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// apiFile is the committed public API: `go doc -all` of every public
// package. A change to an exported name, signature or doc comment fails
// TestPublicAPIUnchanged until the file is regenerated on purpose:
//
//	NATSAGENT_UPDATE_API=1 go test -run TestPublicAPIUnchanged .
//
// so every API change shows up in review (CONTRIBUTING.md).
const apiFile = "testdata/api.txt"

var publicPackages = []string{".", "./natsagenttest"}

func TestPublicAPIUnchanged(t *testing.T) {
	var got bytes.Buffer
	for _, p := range publicPackages {
		out, err := exec.Command("go", "doc", "-all", p).CombinedOutput()
		if err != nil {
			t.Fatalf("go doc -all %s: %v\n%s", p, err, out)
		}
		got.WriteString("==== " + p + "\n")
		got.Write(out)
	}
	if os.Getenv("NATSAGENT_UPDATE_API") == "1" {
		if err := os.WriteFile(apiFile, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(apiFile)
	if err != nil {
		t.Fatalf("%v: generate it with NATSAGENT_UPDATE_API=1 go test -run TestPublicAPIUnchanged .", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		gotLines, wantLines := bytes.Split(got.Bytes(), []byte("\n")), bytes.Split(want, []byte("\n"))
		for i := 0; i < len(gotLines) || i < len(wantLines); i++ {
			var g, w []byte
			if i < len(gotLines) {
				g = gotLines[i]
			}
			if i < len(wantLines) {
				w = wantLines[i]
			}
			if !bytes.Equal(g, w) {
				t.Fatalf("the public API changed (first difference at line %d of %s):\n  committed: %s\n  now:       %s\nIf the change is intended, regenerate the file: NATSAGENT_UPDATE_API=1 go test -run TestPublicAPIUnchanged . and say why in the commit (CONTRIBUTING.md).",
					i+1, apiFile, w, g)
			}
		}
	}
}
