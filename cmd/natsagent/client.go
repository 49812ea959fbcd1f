package main

// The client commands talk to a deployment through the public Go client
// (natsagent.Client), as any Go service would: run requests on the runs
// stream, events from the events stream, cancel and delete as core
// requests, records read from KV. They import neither internal/kv nor
// internal/submit (TestClientsDependOnTheWireOnly). This file holds what
// they share: the connection flags, the connection, and the errors that
// say what to do.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/natsconn"
	"github.com/natsagent/natsagent/internal/protocol"
)

// envTenant names the tenant of every command unless --tenant does.
const envTenant = "NATSAGENT_TENANT"

// clientFlags are the flags every client command takes.
type clientFlags struct {
	config string
	server string
	creds  string
	prefix string
	tenant string
	json   bool
}

func addClientFlags(fs *flag.FlagSet) *clientFlags {
	f := &clientFlags{}
	fs.StringVar(&f.config, "config", os.Getenv("NATSAGENT_CONFIG"), "the deployment's YAML configuration, for its NATS URL, credentials and prefix (env NATSAGENT_CONFIG)")
	fs.StringVar(&f.server, "server", "", "NATS server URLs, comma-separated (env NATS_URL; default nats://127.0.0.1:4222)")
	fs.StringVar(&f.creds, "creds", "", "NATS credentials file (env NATS_CREDS; other credentials and TLS come from --config or the NATS_* environment)")
	fs.StringVar(&f.prefix, "prefix", "", "prefix of the deployment's subjects, streams and buckets (default agent)")
	fs.StringVar(&f.tenant, "tenant", envOr(envTenant, protocol.DefaultTenant), "tenant (env "+envTenant+")")
	fs.BoolVar(&f.json, "json", false, "print JSON for machines instead of text")
	return f
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// settings resolves the configuration: the file when one is given (the
// binaries read the same one, so prefix and names agree), the
// environment, then the flags.
func (f *clientFlags) settings() (config.Config, error) {
	cfg, err := config.Load(f.config)
	if err != nil {
		if f.config != "" {
			return cfg, err
		}
		// Without a file only the environment can be wrong, and only its
		// NATS settings are this command's business: a model endpoint
		// configured for the binaries must not stop it.
		if err := natsErrors(err); err != nil {
			return cfg, err
		}
	}
	if f.server != "" {
		cfg.NATS.URL = f.server
	}
	if f.creds != "" {
		cfg.NATS.CredsFile = f.creds
	}
	if f.prefix != "" {
		cfg.NATS.Prefix = f.prefix
	}
	if err := protocol.CheckToken("--tenant", f.tenant); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// natsErrors keeps the lines of a configuration error that concern the
// nats section (config.Validate names each bad field's path).
func natsErrors(err error) error {
	var keep []string
	for _, line := range strings.Split(err.Error(), "\n") {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "nats.") {
			keep = append(keep, line)
		}
	}
	if len(keep) == 0 {
		return nil
	}
	return errors.New("invalid NATS settings in the environment:\n  " + strings.Join(keep, "\n  "))
}

// client is a connection to one deployment, through the public client.
type client struct {
	url    string
	tenant string
	prefix string
	nc     *nats.Conn
	api    *natsagent.Client
}

// connect dials NATS and binds the deployment's streams and buckets.
func (f *clientFlags) connect(ctx context.Context) (*client, error) {
	cfg, err := f.settings()
	if err != nil {
		return nil, err
	}
	if _, err := bus.NewNames(cfg.NATS.Prefix); err != nil {
		return nil, fmt.Errorf("--prefix: %w", err)
	}
	nc, err := natsconn.Connect(cfg, "natsagent-cli")
	if err != nil {
		return nil, unreachable(cfg.NATS.URL, err)
	}
	c := &client{url: cfg.NATS.URL, tenant: f.tenant, prefix: cfg.NATS.Prefix, nc: nc}
	if c.prefix == "" {
		c.prefix = bus.DefaultPrefix
	}
	c.api, err = natsagent.NewClient(nc, &natsagent.ClientConfig{
		Prefix: cfg.NATS.Prefix, Tenant: f.tenant, MaxRequestBytes: cfg.NATS.MaxRequestBytes, Name: submitter,
	})
	if err != nil {
		nc.Close()
		return nil, c.missing(err)
	}
	return c, nil
}

// missing explains a stream or bucket that is not there.
func (c *client) missing(err error) error {
	switch {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("JetStream is not enabled on the NATS server at %s (for this account): natsagent needs it; start nats-server with -js", c.url)
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrBucketNotFound):
		return fmt.Errorf("no natsagent deployment with prefix %q at %s (%v): check --prefix (or nats.prefix in --config), or start the gateway or a worker once: they create the streams and buckets", c.prefix, c.url, errors.Unwrap(err))
	}
	return fmt.Errorf("open the deployment with prefix %q at %s: %w", c.prefix, c.url, err)
}

func (c *client) close() { c.nc.Close() }

// unreachable names the URLs that were tried (without their user info)
// and how to point elsewhere. The error itself comes from natsconn.Connect,
// which masks credentials and explains refused ones.
func unreachable(urls string, err error) error {
	msg := err.Error()
	// bus.Connect says where it connected; the URL list is said here
	// (URLs hold no ": ").
	if rest, ok := strings.CutPrefix(msg, "connect to NATS at "); ok {
		if i := strings.Index(rest, ": "); i >= 0 {
			msg = rest[i+2:]
		}
	}
	down := false
	for _, s := range []string{"connection refused", "i/o timeout", "no route to host", "no such host"} {
		down = down || strings.Contains(msg, s)
	}
	if down || errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout) {
		return fmt.Errorf("cannot reach NATS at %s (%s): start a server there or point --server (or NATS_URL) at one", displayURLs(urls), msg)
	}
	return fmt.Errorf("cannot connect to NATS at %s: %s; check --server, --creds and --config", displayURLs(urls), msg)
}

// displayURLs masks the user info of comma-separated NATS URLs.
func displayURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if u, err := url.Parse(p); err == nil && u.User != nil {
			u.User = nil
			p = strings.Replace(u.String(), "://", "://***@", 1)
		}
		parts[i] = p
	}
	return strings.Join(parts, ",")
}

// run reads a run of the client's tenant as clients see it; thread may be
// "" when unknown. A missing one is reported with how to find the right
// id, and a run of another thread than the one named is refused.
func (c *client) run(ctx context.Context, thread, run string) (*protocol.Run, error) {
	if err := protocol.CheckToken("run id", run); err != nil {
		return nil, err
	}
	rec, err := c.api.Run(ctx, run)
	if errors.Is(err, natsagent.ErrNotFound) {
		return nil, fmt.Errorf("run %s not found in tenant %s: list a thread's runs with `natsagent runs --thread <thread>`", run, c.tenant)
	}
	if err != nil {
		return nil, err
	}
	if thread != "" && rec.ThreadID != thread {
		return nil, fmt.Errorf("run %s is on thread %s, not %s", run, rec.ThreadID, thread)
	}
	return rec, nil
}

// thread reads a thread record of the client's tenant.
func (c *client) thread(ctx context.Context, thread string) (*protocol.Thread, error) {
	if err := protocol.CheckToken("thread id", thread); err != nil {
		return nil, err
	}
	th, err := c.api.Thread(ctx, thread)
	if errors.Is(err, natsagent.ErrNotFound) {
		return nil, fmt.Errorf("thread %s not found in tenant %s: list threads with `natsagent threads`", thread, c.tenant)
	}
	return th, err
}

// parseArgs parses flags wherever they appear among the positional
// arguments (`run "hello" --thread t1`), which the flag package alone
// does not. Everything after "--" is positional.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if i := len(args) - len(rest) - 1; i >= 0 && args[i] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// newFlagSet is a flag set whose usage prints a summary first.
func newFlagSet(name, synopsis, about string, std stdio) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(std.err)
	fs.Usage = func() {
		fmt.Fprintf(std.err, "Usage: natsagent %s %s\n\n", name, synopsis)
		fmt.Fprintln(std.err, strings.TrimSpace(about))
		writeExamples(std.err, name)
		fmt.Fprintln(std.err)
		fmt.Fprintln(std.err, "Flags:")
		fs.PrintDefaults()
	}
	return fs
}

// parseErr turns a flag error into what run() expects: help stays help,
// anything else was printed and is a usage error.
func parseErr(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return errUsage
}

// usageErr prints a command-line mistake and returns errUsage.
func usageErr(std stdio, name, format string, args ...any) error {
	fmt.Fprintf(std.err, "natsagent %s: %s\n", name, fmt.Sprintf(format, args...))
	return errUsage
}
