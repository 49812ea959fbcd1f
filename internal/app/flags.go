package app

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/natsagent/natsagent/internal/config"
)

// Flags are the command-line flags every natsagent process shares. A flag
// given on the command line wins over the environment and the file.
type Flags struct {
	fs          *flag.FlagSet
	ConfigPath  string
	natsURL     string
	prefix      string
	replicas    int
	concurrency int
	Console     bool
	Debug       bool
	PrintConfig bool
	// AssemblesAgents says the process builds the agent profiles (a
	// worker, a gateway with --dev): Load checks them (CheckProfiles)
	// before anything connects. --print-config checks them always.
	AssemblesAgents bool
	// Addresses are a command's own listen flags (name to value, an
	// empty value: none): Load checks each is host:port and reports the
	// ones that are not with the configuration's mistakes.
	Addresses map[string]string
}

// RegisterFlags adds the shared flags to fs.
func RegisterFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{fs: fs}
	fs.StringVar(&f.ConfigPath, "config", os.Getenv("NATSAGENT_CONFIG"), "YAML configuration file (env NATSAGENT_CONFIG)")
	fs.StringVar(&f.natsURL, "nats-url", "", "NATS server or cluster URLs, comma-separated (env NATS_URL)")
	fs.StringVar(&f.prefix, "prefix", "", "prefix of every subject, stream and bucket (default agent)")
	fs.IntVar(&f.replicas, "replicas", 0, "JetStream replicas for streams and buckets: 1 or 3")
	fs.IntVar(&f.concurrency, "concurrency", 0, "runs a worker executes at once (default 8)")
	fs.BoolVar(&f.Console, "log-console", false, "human-readable logs instead of JSON lines")
	fs.BoolVar(&f.Debug, "debug", false, "debug logging")
	fs.BoolVar(&f.PrintConfig, "print-config", false, "check the configuration and the agent profiles, print the effective configuration (secrets masked) and exit")
	return f
}

// Load reads the configuration and applies the flags that were set. A
// configuration with mistakes is refused with all of them at once: the
// file's, the values', and, for a process that assembles the agent
// profiles (or --print-config), the profiles' (ProfileProblems).
func (f *Flags) Load() (config.Config, error) {
	cfg, err := config.Load(f.ConfigPath)
	var invalid *config.Error
	if err != nil && !errors.As(err, &invalid) {
		return cfg, err
	}
	f.fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "nats-url":
			cfg.NATS.URL = f.natsURL
		case "prefix":
			cfg.NATS.Prefix = f.prefix
		case "replicas":
			cfg.NATS.Replicas = f.replicas
		case "concurrency":
			cfg.Worker.Concurrency = f.concurrency
		}
	})
	var problems []string
	if invalid != nil {
		problems = invalid.Problems
	} else if err := cfg.Validate(); err != nil {
		if !errors.As(err, &invalid) {
			return cfg, err
		}
		problems = invalid.Problems
	}
	for _, name := range slices.Sorted(maps.Keys(f.Addresses)) {
		if v := f.Addresses[name]; v != "" {
			if err := config.CheckAddress(v); err != nil {
				problems = append(problems, fmt.Sprintf("--%s: %v", name, err))
			}
		}
	}
	if f.AssemblesAgents || f.PrintConfig {
		located, other := ProfileProblems(cfg)
		if len(problems) == 0 {
			// Otherwise the rest of the assembly's complaints may come
			// from a mistake already reported (a policy, a model endpoint).
			problems = append(problems, other...)
		}
		problems = append(problems, located...)
	}
	if len(problems) > 0 {
		return cfg, config.Invalid(problems)
	}
	if f.PrintConfig {
		fmt.Print(cfg.String())
		os.Exit(0)
	}
	return cfg, nil
}
