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
	if s := d.Sandbox; s.Isolation != IsolationBubblewrap || s.MaxProcesses != 64 || s.MaxMemoryBytes != 1<<30 || s.MaxOpenFiles != 256 || s.MaxTmpBytes != 64<<20 || s.MaxWorkdirBytes != 256<<20 {
		t.Errorf("sandbox defaults %+v", s)
	}
	// execute works on the object store backend too (a copy of the
	// workdir, written back).
	cfg, err = Load(writeConfig(t, `
files:
  sandbox: {enabled: true, isolation: none, max_processes: 8, max_memory_bytes: 134217728, max_open_files: 64, max_tmp_bytes: 1048576, max_workdir_bytes: 2097152}
`))
	if err != nil {
		t.Fatal(err)
	}
	if f := cfg.Files; f.Backend != FilesObjectStore || !f.Sandbox.Enabled || f.Sandbox.Isolation != IsolationNone || f.Sandbox.MaxProcesses != 8 ||
		f.Sandbox.MaxMemoryBytes != 128<<20 || f.Sandbox.MaxOpenFiles != 64 || f.Sandbox.MaxTmpBytes != 1<<20 || f.Sandbox.MaxWorkdirBytes != 2<<20 {
		t.Errorf("loaded %+v", f.Sandbox)
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
		// Without a workdir there is nothing to execute on.
		{"files: {backend: none, sandbox: {enabled: true}}", []string{"files.sandbox.enabled", "none"}},
		{"files: {sandbox: {isolation: chroot}}", []string{"files.sandbox.isolation", `"chroot"`, "bubblewrap"}},
		{"files: {sandbox: {max_processes: 1}}", []string{"files.sandbox.max_processes"}},
		{"files: {sandbox: {max_memory_bytes: 1000}}", []string{"files.sandbox.max_memory_bytes", "64 MiB"}},
		{"files: {sandbox: {max_open_files: 3}}", []string{"files.sandbox.max_open_files"}},
		{"files: {sandbox: {max_tmp_bytes: -1}}", []string{"files.sandbox.max_tmp_bytes"}},
		{"files: {sandbox: {max_workdir_bytes: 0}}", []string{"files.sandbox.max_workdir_bytes"}},
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
