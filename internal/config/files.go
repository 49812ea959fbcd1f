package config

// Files configures the threads' workdirs: where their files live, how
// large one may be, and whether runs may execute commands on them.
type Files struct {
	// Backend is objectstore (default: the deployment's JetStream Object
	// Store, any worker continues any run), local (a directory of this
	// machine: one node, or a shared volume) or none (runs have no
	// workdir; the file tools say so).
	Backend string `yaml:"backend"`
	// LocalDir is the root of the local backend (default ./data/files);
	// each thread gets <local_dir>/<tenant>/<thread>.
	LocalDir string `yaml:"local_dir"`
	// MaxFileBytes bounds one file, written by a tool or uploaded (default
	// 32 MiB).
	MaxFileBytes int64 `yaml:"max_file_bytes"`
	// Sandbox offers the execute tool.
	Sandbox Sandbox `yaml:"sandbox"`
}

// Sandbox configures the execute tool. It runs commands as the worker's
// user in the thread's local directory, with a scrubbed environment and a
// time limit; it is not an isolation boundary, so enable it where the
// worker itself is isolated (a container).
type Sandbox struct {
	Enabled bool `yaml:"enabled"`
	// TimeoutSeconds is a command's time limit unless it asks for another
	// (default 60, at most 600).
	TimeoutSeconds int `yaml:"timeout_seconds"`
}

// File backends.
const (
	FilesObjectStore = "objectstore"
	FilesLocal       = "local"
	FilesNone        = "none"
)

// Limits of the files section.
const (
	DefaultMaxFileBytes     = 32 << 20
	maxMaxFileBytes         = 1 << 30
	DefaultSandboxTimeout   = 60
	maxSandboxTimeoutSecond = 600
)

func defaultFiles() Files {
	return Files{
		Backend:      FilesObjectStore,
		LocalDir:     "./data/files",
		MaxFileBytes: DefaultMaxFileBytes,
		Sandbox:      Sandbox{TimeoutSeconds: DefaultSandboxTimeout},
	}
}

func (f *Files) validate(bad func(path, format string, args ...any)) {
	switch f.Backend {
	case FilesObjectStore, FilesLocal, FilesNone:
	default:
		bad("files.backend", "%q is not one of objectstore, local, none", f.Backend)
	}
	if f.Backend == FilesLocal && f.LocalDir == "" {
		bad("files.local_dir", "is required with files.backend: local")
	}
	if f.MaxFileBytes < 1 || f.MaxFileBytes > maxMaxFileBytes {
		bad("files.max_file_bytes", "must be between 1 and %d (1 GiB), not %d", maxMaxFileBytes, f.MaxFileBytes)
	}
	if f.Sandbox.Enabled && f.Backend != FilesLocal {
		bad("files.sandbox.enabled", "execute runs commands in the thread's directory on the worker, so it needs files.backend: local; the %s backend cannot offer it", f.Backend)
	}
	if t := f.Sandbox.TimeoutSeconds; t < 1 || t > maxSandboxTimeoutSecond {
		bad("files.sandbox.timeout_seconds", "must be between 1 and %d, not %d", maxSandboxTimeoutSecond, t)
	}
}
