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

// Sandbox configures the execute tool. Each command runs in bubblewrap
// (new namespaces, an unprivileged user, no network, the system read only,
// limits, a wall time) on a copy of the thread's workdir, whatever the
// backend; what it changes there is written back. A worker with the
// sandbox enabled checks at start that bubblewrap works and refuses to
// start otherwise.
type Sandbox struct {
	Enabled bool `yaml:"enabled"`
	// Isolation is bubblewrap (default) or none: commands run as the
	// worker's user with its file system and network, only for a worker
	// that is itself a disposable container. The worker logs a warning at
	// start.
	Isolation string `yaml:"isolation"`
	// TimeoutSeconds is a command's time limit unless it asks for another
	// (default 60, at most 600).
	TimeoutSeconds int `yaml:"timeout_seconds"`
	// MaxProcesses bounds the processes and threads of one command
	// (default 64).
	MaxProcesses int `yaml:"max_processes"`
	// MaxMemoryBytes bounds the address space of each process of a
	// command (default 1 GiB).
	MaxMemoryBytes int64 `yaml:"max_memory_bytes"`
	// MaxOpenFiles bounds the open files of each process (default 256).
	MaxOpenFiles int `yaml:"max_open_files"`
	// MaxTmpBytes is the size of a command's private /tmp (default 64 MiB).
	MaxTmpBytes int64 `yaml:"max_tmp_bytes"`
	// MaxWorkdirBytes bounds the copy of the workdir a command gets and
	// what it writes back (default 256 MiB).
	MaxWorkdirBytes int64 `yaml:"max_workdir_bytes"`
}

// Sandbox isolations.
const (
	IsolationBubblewrap = "bubblewrap"
	IsolationNone       = "none"
)

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
	DefaultSandboxProcesses = 64
	DefaultSandboxMemory    = 1 << 30
	DefaultSandboxOpenFiles = 256
	DefaultSandboxTmp       = 64 << 20
	DefaultSandboxWorkdir   = 256 << 20
)

func defaultFiles() Files {
	return Files{
		Backend:      FilesObjectStore,
		LocalDir:     "./data/files",
		MaxFileBytes: DefaultMaxFileBytes,
		Sandbox: Sandbox{
			Isolation:       IsolationBubblewrap,
			TimeoutSeconds:  DefaultSandboxTimeout,
			MaxProcesses:    DefaultSandboxProcesses,
			MaxMemoryBytes:  DefaultSandboxMemory,
			MaxOpenFiles:    DefaultSandboxOpenFiles,
			MaxTmpBytes:     DefaultSandboxTmp,
			MaxWorkdirBytes: DefaultSandboxWorkdir,
		},
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
	f.Sandbox.validate(f.Backend, bad)
}

func (s *Sandbox) validate(backend string, bad func(path, format string, args ...any)) {
	if s.Enabled && backend == FilesNone {
		bad("files.sandbox.enabled", "execute works on the thread's workdir, and files.backend: none gives runs none; choose objectstore or local")
	}
	switch s.Isolation {
	case IsolationBubblewrap, IsolationNone:
	default:
		bad("files.sandbox.isolation", "%q is not one of bubblewrap, none", s.Isolation)
	}
	if t := s.TimeoutSeconds; t < 1 || t > maxSandboxTimeoutSecond {
		bad("files.sandbox.timeout_seconds", "must be between 1 and %d, not %d", maxSandboxTimeoutSecond, t)
	}
	if n := s.MaxProcesses; n < 4 || n > 4096 {
		bad("files.sandbox.max_processes", "must be between 4 and 4096, not %d", n)
	}
	if n := s.MaxMemoryBytes; n < 64<<20 || n > 64<<30 {
		bad("files.sandbox.max_memory_bytes", "must be between %d (64 MiB) and %d (64 GiB), not %d", 64<<20, int64(64<<30), n)
	}
	if n := s.MaxOpenFiles; n < 16 || n > 65536 {
		bad("files.sandbox.max_open_files", "must be between 16 and 65536, not %d", n)
	}
	if n := s.MaxTmpBytes; n < 1<<20 || n > 16<<30 {
		bad("files.sandbox.max_tmp_bytes", "must be between %d (1 MiB) and %d (16 GiB), not %d", 1<<20, int64(16<<30), n)
	}
	if n := s.MaxWorkdirBytes; n < 1<<20 || n > 16<<30 {
		bad("files.sandbox.max_workdir_bytes", "must be between %d (1 MiB) and %d (16 GiB), not %d", 1<<20, int64(16<<30), n)
	}
}
