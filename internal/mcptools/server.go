package mcptools

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"os/exec"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/config"
)

// minStartTimeout bounds connecting and listing at start when a server's
// call timeout is shorter: a stdio server launched through a package
// runner may first have to fetch itself.
const minStartTimeout = time.Minute

// terminateAfter is how long a stdio server may take to exit once its
// input is closed, before it is signalled (and as long again before it is
// killed).
const terminateAfter = 2 * time.Second

// errClosed answers calls that arrive after Close.
var errClosed = errors.New("the worker is shutting down")

// server is one configured MCP server and its current session, if any.
type server struct {
	cfg     config.MCPServer
	timeout time.Duration
	log     *zap.Logger
	client  *mcp.Client
	// env is a stdio server's whole environment; headers go with every
	// request to an http server. Both are expanded once at start.
	env     []string
	headers http.Header

	mu      sync.Mutex
	cur     *session
	dialing *dial
	closed  bool
	// wg counts the goroutines a server starts, so Close returns only
	// when none is left.
	wg sync.WaitGroup
}

// session is one connection to the server: an MCP client session and,
// for stdio, the process behind it.
type session struct {
	cs  *mcp.ClientSession
	cmd *exec.Cmd
}

// close ends the session; a stdio server's input is closed, then it is
// signalled, and finally anything left in its process group is killed.
func (c *session) close() {
	_ = c.cs.Close()
	if c.cmd != nil {
		killGroup(c.cmd)
	}
}

// dial is a reconnection in progress, shared by the calls that wait for
// it.
type dial struct {
	done chan struct{}
	c    *session
	err  error
}

func newServer(cfg config.MCPServer, opts Options) (*server, error) {
	s := &server{
		cfg:     cfg,
		timeout: cfg.Timeout(),
		log:     opts.Logger.With(zap.String("mcp_server", cfg.Name)),
		// No capabilities: natsagent offers the server no roots, sampling
		// or elicitation.
		client: mcp.NewClient(&mcp.Implementation{Name: "natsagent"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}}),
	}
	switch cfg.Transport {
	case config.MCPStdio:
		// Only what is configured, plus PATH so the command can find its
		// own helpers: a worker's secrets do not leak into every server.
		s.env = []string{}
		if _, set := cfg.Env["PATH"]; !set {
			if p, ok := opts.LookupEnv("PATH"); ok {
				s.env = append(s.env, "PATH="+p)
			}
		}
		for _, k := range slices.Sorted(maps.Keys(cfg.Env)) {
			v, err := cfg.Env[k].Expand(opts.LookupEnv)
			if err != nil {
				return nil, fmt.Errorf("%s: env.%s: %w", s.describe(), k, err)
			}
			s.env = append(s.env, k+"="+v)
		}
	case config.MCPHTTP:
		s.headers = make(http.Header)
		for _, k := range slices.Sorted(maps.Keys(cfg.Headers)) {
			v, err := cfg.Headers[k].Expand(opts.LookupEnv)
			if err != nil {
				return nil, fmt.Errorf("%s: headers.%s: %w", s.describe(), k, err)
			}
			s.headers.Set(k, v)
		}
	default:
		return nil, fmt.Errorf("%s: transport %q is not stdio or http", s.describe(), cfg.Transport)
	}
	return s, nil
}

// describe names the server in errors, without arguments, headers or a
// query string that may hold secrets.
func (s *server) describe() string {
	switch s.cfg.Transport {
	case config.MCPStdio:
		return fmt.Sprintf("mcp server %q (stdio command %s)", s.cfg.Name, s.cfg.Command)
	case config.MCPHTTP:
		where := s.cfg.URL
		if u, err := url.Parse(s.cfg.URL); err == nil {
			where = u.Scheme + "://" + u.Host + u.Path
		}
		return fmt.Sprintf("mcp server %q (http %s)", s.cfg.Name, where)
	}
	return fmt.Sprintf("mcp server %q", s.cfg.Name)
}

// start connects, lists the tools and keeps the session.
func (s *server) start(ctx context.Context) ([]*Tool, error) {
	ctx, cancel := context.WithTimeout(ctx, max(s.timeout, minStartTimeout))
	defer cancel()
	c, err := s.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s failed to start: %w", s.describe(), err)
	}
	list, err := s.list(ctx, c)
	if err != nil {
		c.close()
		return nil, err
	}
	s.mu.Lock()
	s.cur = c
	s.watch(c)
	s.mu.Unlock()
	s.log.Info("mcp server connected", zap.Int("tools", len(list)))
	return list, nil
}

// list builds the tools the server offers and the allow-list admits.
func (s *server) list(ctx context.Context, c *session) ([]*Tool, error) {
	var list []*Tool
	offered := make(map[string]bool)
	allowed := make(map[string]bool, len(s.cfg.Tools))
	for _, n := range s.cfg.Tools {
		allowed[n] = true
	}
	for t, err := range c.cs.Tools(ctx, nil) {
		if err != nil {
			return nil, fmt.Errorf("%s: list tools: %w", s.describe(), err)
		}
		if t.Name == "" {
			return nil, fmt.Errorf("%s: lists a tool without a name", s.describe())
		}
		offered[t.Name] = true
		if len(allowed) > 0 && !allowed[t.Name] {
			continue
		}
		tool, err := newTool(s, t)
		if err != nil {
			return nil, fmt.Errorf("%s: tool %q: %w", s.describe(), t.Name, err)
		}
		list = append(list, tool)
	}
	for _, n := range s.cfg.Tools {
		if !offered[n] {
			return nil, fmt.Errorf("%s: the allow-list names tool %q, which the server does not offer (it offers: %s)", s.describe(), n, joinSorted(offered))
		}
	}
	return list, nil
}

// connect opens a new session.
func (s *server) connect(ctx context.Context) (*session, error) {
	switch s.cfg.Transport {
	case config.MCPStdio:
		cmd := exec.Command(s.cfg.Command, s.cfg.Args...)
		cmd.Env = s.env
		stderr := &tail{log: s.log}
		cmd.Stderr = stderr
		isolate(cmd)
		cs, err := s.client.Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: terminateAfter}, nil)
		if err != nil {
			// The SDK closed what it started; a process that lingers
			// anyway goes with its group.
			if cmd.Process != nil {
				killGroup(cmd)
			}
			if out := stderr.String(); out != "" {
				err = fmt.Errorf("%w; its stderr ends with: %s", err, out)
			}
			return nil, err
		}
		return &session{cs: cs, cmd: cmd}, nil
	default:
		t := &mcp.StreamableClientTransport{
			Endpoint:   s.cfg.URL,
			HTTPClient: &http.Client{Transport: withHeaders{base: http.DefaultTransport, headers: s.headers}},
			// Tool calls are request and response: the standing stream
			// for server notifications would only hold a connection.
			DisableStandaloneSSE: true,
		}
		cs, err := s.client.Connect(ctx, t, nil)
		if err != nil {
			return nil, err
		}
		return &session{cs: cs}, nil
	}
}

// spawn runs fn in a goroutine Close waits for; after Close it runs
// nothing. Called with s.mu held.
func (s *server) spawn(fn func()) {
	if !s.closed {
		s.wg.Go(fn)
	}
}

// watch forgets the session when it ends (a stdio server exited, an http
// session was closed), so the next call reconnects instead of failing.
// Called with s.mu held.
func (s *server) watch(c *session) {
	s.spawn(func() {
		_ = c.cs.Wait()
		s.mu.Lock()
		lost := s.cur == c && !s.closed
		if s.cur == c {
			s.cur = nil
		}
		s.mu.Unlock()
		if lost {
			s.log.Warn("mcp server connection lost; it is reconnected at its next call")
		}
		c.close()
	})
}

// session returns the current session, reconnecting when there is none.
// Concurrent calls share one reconnection; each waits at most as long as
// its own ctx allows.
func (s *server) session(ctx context.Context) (*session, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	if c := s.cur; c != nil {
		s.mu.Unlock()
		return c, nil
	}
	d := s.dialing
	if d == nil {
		d = &dial{done: make(chan struct{})}
		s.dialing = d
		s.spawn(func() { s.redial(d) })
	}
	s.mu.Unlock()
	select {
	case <-d.done:
		return d.c, d.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// redial reconnects. It runs apart from the call that asked for it, so a
// run cancelled meanwhile does not spoil the session for the others.
func (s *server) redial(d *dial) {
	defer close(d.done)
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	c, err := s.connect(ctx)
	s.mu.Lock()
	s.dialing = nil
	closed := s.closed
	if err == nil && !closed {
		s.cur = c
		s.watch(c)
	}
	s.mu.Unlock()
	switch {
	case err != nil:
		s.log.Warn("mcp server reconnect failed", zap.Error(err))
		d.err = err
	case closed:
		c.close()
		d.err = errClosed
	default:
		s.log.Info("mcp server reconnected")
		d.c = c
	}
}

// drop forgets a session whose connection failed during a call and closes
// it; the next call reconnects.
func (s *server) drop(c *session, why error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A session that is no longer current was closed by whoever replaced
	// it (the watcher, another drop, Close).
	if s.cur != c {
		return
	}
	s.cur = nil
	s.log.Warn("mcp server connection failed during a call; it is reconnected at its next call", zap.Error(why))
	s.spawn(c.close)
}

// probe checks a session after a call timed out: a server that cannot
// answer a ping within a whole call timeout is taken for hung, and is
// replaced at the next call. A merely slow tool leaves it alone.
func (s *server) probe(c *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.spawn(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
		defer cancel()
		if err := c.cs.Ping(ctx, nil); err != nil && classify(err) != answered {
			s.drop(c, fmt.Errorf("no answer to a ping after a call timed out: %w", err))
		}
	})
}

func (s *server) close() {
	s.mu.Lock()
	s.closed = true
	c := s.cur
	s.cur = nil
	s.mu.Unlock()
	if c != nil {
		c.close()
	}
	s.wg.Wait()
}

// withHeaders adds the configured headers to every request.
type withHeaders struct {
	base    http.RoundTripper
	headers http.Header
}

func (t withHeaders) RoundTrip(req *http.Request) (*http.Response, error) {
	if len(t.headers) > 0 {
		req = req.Clone(req.Context())
		for k, v := range t.headers {
			req.Header[k] = v
		}
	}
	return t.base.RoundTrip(req)
}

// tail keeps the end of a stdio server's stderr for start-up errors and
// logs it at debug level.
type tail struct {
	log *zap.Logger
	mu  sync.Mutex
	buf []byte
}

const tailSize = 2048

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.log.Debug("mcp server stderr", zap.ByteString("output", p))
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailSize {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-tailSize:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}
