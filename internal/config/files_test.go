package config

import (
	"strings"
	"testing"
)

func TestFilesDefaultsAndFile(t *testing.T) {
	d := Default().Files
	if d.Backend != FilesObjectStore || d.LocalDir != "./data/files" || d.MaxFileBytes != 32<<20 || d.Sandbox.Enabled || d.Sandbox.TimeoutSeconds != 60 {
		t.Errorf("defaults %+v", d)
	}
	cfg, err := Load(writeConfig(t, `
files:
  backend: local
  local_dir: /var/lib/natsagent/files
  max_file_bytes: 1048576
  sandbox: {enabled: true, timeout_seconds: 120}
`))
	if err != nil {
		t.Fatal(err)
	}
	if f := cfg.Files; f.Backend != FilesLocal || f.LocalDir != "/var/lib/natsagent/files" || f.MaxFileBytes != 1<<20 || !f.Sandbox.Enabled || f.Sandbox.TimeoutSeconds != 120 {
		t.Errorf("loaded %+v", f)
	}
}

func TestFilesValidation(t *testing.T) {
	cases := []struct {
		yaml string
		want []string
	}{
		{"files: {backend: s3}", []string{"files.backend", `"s3"`}},
		{"files: {backend: local, local_dir: ''}", []string{"files.local_dir"}},
		{"files: {max_file_bytes: 0}", []string{"files.max_file_bytes"}},
		// The object store backend cannot offer execute: refused at
		// configuration time.
		{"files: {sandbox: {enabled: true}}", []string{"files.sandbox.enabled", "files.backend: local", "objectstore"}},
		{"files: {backend: none, sandbox: {enabled: true}}", []string{"files.sandbox.enabled"}},
		{"files: {backend: local, sandbox: {enabled: true, timeout_seconds: 601}}", []string{"files.sandbox.timeout_seconds", "600"}},
		{"files: {sandbox: {timeout_seconds: 0}}", []string{"files.sandbox.timeout_seconds"}},
		{"files: {backnd: local}", []string{"backnd"}},
	}
	for _, c := range cases {
		_, err := Load(writeConfig(t, c.yaml))
		if err == nil {
			t.Errorf("%s: accepted", c.yaml)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %s", c.yaml, err, w)
			}
		}
	}
}
