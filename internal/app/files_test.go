package app

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/natstest"
	"github.com/natsagent/natsagent/internal/tools"
)

func TestFiles_ObjectStoreSharedByConnections(t *testing.T) {
	srv := natstest.Start(t)
	nc1, nc2 := srv.Connect(), srv.Connect()
	settings := bus.Settings{}.WithDefaults()
	natstest.Provision(t, nc1, settings)
	cfg := config.Default()
	cfg.Files.MaxFileBytes = 100
	open1, err := Files(context.Background(), cfg, nc1, settings)
	if err != nil {
		t.Fatal(err)
	}
	open2, err := Files(context.Background(), cfg, nc2, settings)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := open1("default", "h1").Write(ctx, "/a.txt", []byte("from one")); err != nil {
		t.Fatal(err)
	}
	if got, err := open2("default", "h1").Read(ctx, "/a.txt"); err != nil || string(got) != "from one" {
		t.Errorf("second connection reads %q, %v", got, err)
	}
	if err := open2("default", "h1").Write(ctx, "/big", make([]byte, 101)); !errors.Is(err, files.ErrTooLarge) {
		t.Errorf("files.max_file_bytes not applied: %v", err)
	}
}

func TestFiles_LocalAndNone(t *testing.T) {
	cfg := config.Default()
	cfg.Files.Backend = config.FilesLocal
	cfg.Files.LocalDir = filepath.Join(t.TempDir(), "files")
	open, err := Files(context.Background(), cfg, nil, bus.Settings{})
	if err != nil {
		t.Fatal(err)
	}
	if err := open("acme", "h1").Write(context.Background(), "/n.md", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cfg.Files.LocalDir, "acme", "h1", "n.md")); err != nil {
		t.Errorf("file not under local_dir/<tenant>/<thread>: %v", err)
	}
	if err := open("acme", "../x").Write(context.Background(), "/n.md", []byte("x")); err == nil {
		t.Error("a bad thread id opened a workdir")
	}

	cfg.Files.Backend = config.FilesNone
	open, err = Files(context.Background(), cfg, nil, bus.Settings{})
	if err != nil || open != nil {
		t.Errorf("backend none: %v, %v", open != nil, err)
	}
}

// The chatbot has the file tools when the deployment keeps files, execute
// only with a sandbox, and no file tools without a workdir.
func TestFiles_ChatbotTools(t *testing.T) {
	demo := model.NewDemo(model.DemoOptions{})
	chatbotTools := func(cfg config.Config) []string {
		t.Helper()
		profiles, err := Profiles(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Agents(cfg, demo); err != nil {
			t.Fatal(err)
		}
		return profiles[len(profiles)-1].Tools
	}
	cfg := config.Default()
	got := chatbotTools(cfg)
	for _, n := range tools.FileToolNames {
		if !slices.Contains(got, n) {
			t.Errorf("chatbot lacks %s: %v", n, got)
		}
	}
	if slices.Contains(got, tools.ToolExecute) {
		t.Error("execute without a sandbox")
	}
	// Isolation none: this test is about tool lists, not bubblewrap.
	cfg.Files.Sandbox.Enabled, cfg.Files.Sandbox.Isolation = true, config.IsolationNone
	if got := chatbotTools(cfg); !slices.Contains(got, tools.ToolExecute) {
		t.Errorf("sandbox on, chatbot tools %v", got)
	}
	cfg = config.Default()
	cfg.Files.Backend = config.FilesNone
	if got := chatbotTools(cfg); slices.Contains(got, tools.ToolReadFile) || !slices.Contains(got, "current_time") {
		t.Errorf("backend none, chatbot tools %v", got)
	}
	// A configured profile cannot name execute without a sandbox.
	cfg = config.Default()
	cfg.Agents = []config.Agent{{Name: "coder", Tools: []string{tools.ToolExecute}}}
	if _, err := Agents(cfg, demo); err == nil {
		t.Error("execute selected without a sandbox")
	}
}

// A worker with the sandbox enabled where bubblewrap cannot run refuses to
// start, naming the setting and saying how to fix it; it never offers an
// unconfined execute instead. Isolation none is the explicit way out, and
// is warned about.
func TestFiles_SandboxRequiredAtStart(t *testing.T) {
	demo := model.NewDemo(model.DemoOptions{})
	t.Setenv("PATH", t.TempDir()) // no bwrap
	cfg := config.Default()
	cfg.Files.Sandbox.Enabled = true
	for name, check := range map[string]func() error{
		"Agents":        func() error { _, err := Agents(cfg, demo); return err },
		"CheckProfiles": func() error { return CheckProfiles(cfg) },
	} {
		err := check()
		if err == nil {
			t.Fatalf("%s: the sandbox enabled without bubblewrap was accepted", name)
		}
		for _, want := range []string{"files.sandbox.enabled", "bwrap is not installed", "apt-get install bubblewrap", "isolation: none"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %q does not say %q", name, err, want)
			}
		}
	}
	if w := SandboxWarning(cfg); w != "" {
		t.Errorf("a warning for bubblewrap: %q", w)
	}
	cfg.Files.Sandbox.Isolation = config.IsolationNone
	if _, err := Agents(cfg, demo); err != nil {
		t.Fatal(err)
	}
	if w := SandboxWarning(cfg); !strings.Contains(w, "isolation is none") {
		t.Errorf("no warning for isolation none: %q", w)
	}
}
