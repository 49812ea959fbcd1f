package app

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/sandbox"
	"github.com/natsagent/natsagent/internal/tools"
)

// Files builds what opens a thread's workdir, as the files section
// configures it: worker.Config.Files for runs and gateway.Config.Files
// for uploads and downloads. It is nil for backend none. The object store
// backend opens its JetStream handles (the files bucket and the threads
// bucket, which holds each thread's file index) once, on nc; the
// function itself does no I/O.
func Files(ctx context.Context, cfg config.Config, nc *nats.Conn, settings bus.Settings) (func(tenant, thread string) files.Workdir, error) {
	limit := files.WithMaxFileBytes(cfg.Files.MaxFileBytes)
	switch cfg.Files.Backend {
	case config.FilesNone:
		return nil, nil
	case config.FilesLocal:
		root := cfg.Files.LocalDir
		if err := os.MkdirAll(root, 0o750); err != nil {
			return nil, fmt.Errorf("files.local_dir: %w", err)
		}
		return func(tenant, thread string) files.Workdir {
			w, err := files.NewLocal(root, tenant, thread, limit)
			if err != nil {
				return files.Unavailable(err)
			}
			return w
		}, nil
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	names := settings.WithDefaults().Names
	store, err := js.ObjectStore(ctx, names.FilesBucket())
	if err != nil {
		return nil, fmt.Errorf("open the object store %s: %w", names.FilesBucket(), err)
	}
	index, err := js.KeyValue(ctx, names.ThreadsBucket())
	if err != nil {
		return nil, fmt.Errorf("open the bucket %s: %w", names.ThreadsBucket(), err)
	}
	return func(tenant, thread string) files.Workdir {
		return files.NewObjectStore(store, index, tenant, thread, limit)
	}, nil
}

// registerExecute adds the execute tool to reg when the configuration
// enables the sandbox; without it the tool does not exist at all. With
// isolation bubblewrap it first runs a trial command in the sandbox and
// fails, naming files.sandbox and saying how to fix it, when bubblewrap is
// missing or cannot create namespaces: a worker never offers execute it
// cannot confine.
func registerExecute(cfg config.Config, reg *tools.Registry) error {
	sc := cfg.Files.Sandbox
	if !sc.Enabled {
		return nil
	}
	sb, err := sandbox.New(context.Background(), sandbox.Config{
		Isolation: sc.Isolation,
		Limits: sandbox.Limits{
			Processes:   sc.MaxProcesses,
			MemoryBytes: sc.MaxMemoryBytes,
			OpenFiles:   sc.MaxOpenFiles,
			FileBytes:   cfg.Files.MaxFileBytes,
			TmpBytes:    sc.MaxTmpBytes,
		},
	})
	if err != nil {
		return fmt.Errorf("files.sandbox.enabled: %w", err)
	}
	reg.Register(tools.Execute(tools.ExecuteConfig{
		Sandbox:         sb,
		Timeout:         time.Duration(sc.TimeoutSeconds) * time.Second,
		MaxFileBytes:    cfg.Files.MaxFileBytes,
		MaxWorkdirBytes: sc.MaxWorkdirBytes,
	}))
	return nil
}

// SandboxWarning is the warning a process that runs agents logs at start
// when execute runs commands unconfined (files.sandbox.isolation: none),
// or "" when it does not.
func SandboxWarning(cfg config.Config) string {
	if !cfg.Files.Sandbox.Enabled || cfg.Files.Sandbox.Isolation != config.IsolationNone {
		return ""
	}
	return "files.sandbox.isolation is none: the execute tool runs the model's commands as this process's user, " +
		"with its files, its network and its credentials; use it only in a disposable container that holds nothing else"
}

// chatbotTools adapts the built-in chatbot's tools to the files section:
// no file tools without a workdir, execute with a sandbox.
func chatbotTools(cfg config.Config, names []string) []string {
	out := slices.Clone(names)
	if cfg.Files.Backend == config.FilesNone {
		out = slices.DeleteFunc(out, func(n string) bool { return slices.Contains(tools.FileToolNames, n) })
	}
	if cfg.Files.Sandbox.Enabled && !slices.Contains(out, tools.ToolExecute) {
		out = append(out, tools.ToolExecute)
	}
	return out
}
