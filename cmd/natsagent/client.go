package main

// The client commands talk to a deployment over NATS directly, the way
// the gateway does: KV for records, the events stream for events, run
// requests on the runs stream, cancel as a core request. This file holds
// what they share: the connection flags, the connection, and the errors
// that say what to do.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/app"
	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/config"
	"github.com/natsagent/natsagent/internal/events"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/kv"
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

// client is a connection to one deployment.
type client struct {
	url    string
	tenant string
	names  bus.Names
	// maxRequest bounds an encoded run request, as the workers do.
	maxRequest int
	nc         *nats.Conn
	js         jetstream.JetStream
	stores     *kv.Stores
	pub        *events.Publisher
	events     jetstream.Stream
}

// connect dials NATS and binds the deployment's streams and buckets.
func (f *clientFlags) connect(ctx context.Context) (*client, error) {
	cfg, err := f.settings()
	if err != nil {
		return nil, err
	}
	names, err := bus.NewNames(cfg.NATS.Prefix)
	if err != nil {
		return nil, fmt.Errorf("--prefix: %w", err)
	}
	nc, err := app.Connect(cfg, "natsagent-cli")
	if err != nil {
		return nil, unreachable(cfg.NATS.URL, err)
	}
	c := &client{url: cfg.NATS.URL, tenant: f.tenant, names: names, maxRequest: cfg.NATS.MaxRequestBytes, nc: nc}
	if err := c.bind(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

func (c *client) bind(ctx context.Context) (err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if c.js, err = jetstream.New(c.nc); err != nil {
		return err
	}
	if c.events, err = c.js.Stream(ctx, c.names.EventsStream()); err != nil {
		return c.missing(err)
	}
	if c.stores, err = kv.Open(ctx, c.js, c.names); err != nil {
		return c.missing(err)
	}
	if c.pub, err = events.NewPublisher(ctx, c.js, c.names, nil); err != nil {
		return c.missing(err)
	}
	return nil
}

// missing explains a stream or bucket that is not there.
func (c *client) missing(err error) error {
	switch {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("JetStream is not enabled on the NATS server at %s (for this account): natsagent needs it; start nats-server with -js", c.url)
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrBucketNotFound):
		return fmt.Errorf("no natsagent deployment with prefix %q at %s (%v): check --prefix (or nats.prefix in --config), or start the gateway or a worker once: they create the streams and buckets", c.names.Prefix, c.url, err)
	}
	return fmt.Errorf("open the deployment with prefix %q at %s: %w", c.names.Prefix, c.url, err)
}

func (c *client) close() {
	// Asynchronous publishes (the thread's run index) must reach the
	// server before the process exits.
	select {
	case <-c.js.PublishAsyncComplete():
	case <-time.After(5 * time.Second):
	}
	c.nc.Close()
}

// unreachable names the URLs that were tried (without their user info)
// and how to point elsewhere. The error itself comes from app.Connect,
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

// run reads a run of the client's tenant as clients see it (kv.RunView);
// thread may be "" when unknown. A missing one is reported with how to
// find the right id.
func (c *client) run(ctx context.Context, thread, run string) (*protocol.Run, error) {
	if err := protocol.CheckToken("run id", run); err != nil {
		return nil, err
	}
	// The view: since protocol v2 a running run's record is pending, or
	// missing until it ends, and its thread's lease says it runs.
	var rec *protocol.Run
	var err error
	if thread == "" {
		rec, err = c.stores.FindRunView(ctx, c.tenant, run)
	} else {
		rec, _, err = c.stores.RunView(ctx, c.tenant, thread, run)
	}
	if errors.Is(err, kv.ErrNotFound) {
		return nil, fmt.Errorf("run %s not found in tenant %s: list a thread's runs with `natsagent runs --thread <thread>`", run, c.tenant)
	}
	return rec, err
}

// thread reads a thread record of the client's tenant.
func (c *client) thread(ctx context.Context, thread string) (*protocol.Thread, uint64, error) {
	if err := protocol.CheckToken("thread id", thread); err != nil {
		return nil, 0, err
	}
	th, rev, err := c.stores.Threads.Get(ctx, c.tenant, thread)
	if errors.Is(err, kv.ErrNotFound) {
		return nil, 0, fmt.Errorf("thread %s not found in tenant %s: list threads with `natsagent threads`", thread, c.tenant)
	}
	return th, rev, err
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

// workdir opens a thread's workdir in the deployment's object store.
func (c *client) workdir(ctx context.Context, thread string) (files.Workdir, error) {
	obj, err := c.js.ObjectStore(ctx, c.names.FilesBucket())
	if err != nil {
		return nil, fmt.Errorf("the deployment keeps no files in NATS (object store %s): %w", c.names.FilesBucket(), err)
	}
	index, err := c.js.KeyValue(ctx, c.names.ThreadsBucket())
	if err != nil {
		return nil, err
	}
	return files.NewObjectStore(obj, index, c.tenant, thread), nil
}
