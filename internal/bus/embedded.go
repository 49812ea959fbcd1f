package bus

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// EmbeddedConfig configures an in-process NATS server with JetStream.
type EmbeddedConfig struct {
	// StoreDir holds JetStream's files.
	StoreDir string
	// Listen is "host:port" for client connections ("127.0.0.1:4222");
	// empty means no TCP listener (in-process connections only) and a port
	// of -1 picks a free one.
	Listen string
	// ServerName defaults to "natsagent".
	ServerName string
	// MaxPayload overrides the server's 1 MiB message limit when > 0.
	MaxPayload int32
	// Log enables the server's own log on stderr.
	Log bool
	// MaxStore, when > 0, bounds JetStream's file store (the server's
	// max_file_store): a full store refuses writes with "insufficient
	// resources".
	MaxStore int64
}

// Embedded is a running in-process NATS server.
type Embedded struct {
	Server *server.Server
}

// StartEmbedded starts a server and waits until it accepts connections.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.StoreDir == "" {
		return nil, errors.New("embedded nats: a store directory is required")
	}
	name := cfg.ServerName
	if name == "" {
		name = "natsagent"
	}
	opts := &server.Options{
		ServerName: name,
		JetStream:  true,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true,
		NoLog:      !cfg.Log,
		MaxPayload: cfg.MaxPayload,
	}
	if cfg.MaxStore > 0 {
		opts.JetStreamMaxStore = cfg.MaxStore
	}
	if cfg.Listen == "" {
		opts.DontListen = true
	} else {
		host, portText, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("embedded nats: listen address %q: %w", cfg.Listen, err)
		}
		port, err := strconv.Atoi(portText)
		if err != nil {
			return nil, fmt.Errorf("embedded nats: listen port %q is not a number", portText)
		}
		if port == 0 {
			// ":0" is any free port, as for net.Listen; the server reads 0
			// as its default, 4222, which another process may hold.
			port = server.RANDOM_PORT
		}
		opts.Host, opts.Port = host, port
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if cfg.Log {
		s.ConfigureLogger()
	}
	go s.Start()
	if !s.ReadyForConnections(15 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded nats: not ready after 15s (is %s already in use?)", cfg.Listen)
	}
	return &Embedded{Server: s}, nil
}

// ClientURL is the URL TCP clients use, or "" without a listener.
func (e *Embedded) ClientURL() string {
	if e.Server.Addr() == nil {
		return ""
	}
	return e.Server.ClientURL()
}

// Connect opens an in-process connection (no TCP). The connection names
// the server's client URL (nats.go's default, 127.0.0.1:4222, without a
// listener), so a log of where a client connected names the port the
// server took.
func (e *Embedded) Connect(name string, opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.InProcessServer(e.Server), nats.Name(name)}, opts...)
	return nats.Connect(e.ClientURL(), opts...)
}

// Shutdown stops the server and waits for it.
func (e *Embedded) Shutdown() {
	e.Server.Shutdown()
	e.Server.WaitForShutdown()
}

// Connect dials a NATS server or cluster (comma-separated URLs) and keeps
// reconnecting forever: a worker or gateway outlives a server restart or a
// node loss instead of exiting.
func Connect(url, name string, opts ...nats.Option) (*nats.Conn, error) {
	base := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(false),
	}
	nc, err := nats.Connect(url, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	return nc, nil
}

// Drain drains nc and waits until it is closed, or until timeout, when it
// closes it. nats.Conn.Drain returns at once and drains in the background:
// a process that exits right after it loses the messages its subscriptions
// were still handling and whatever it had not yet written out.
func Drain(nc *nats.Conn, timeout time.Duration) error {
	closed := nc.StatusChanged(nats.CLOSED)
	defer nc.RemoveStatusListener(closed)
	if err := nc.Drain(); err != nil {
		if errors.Is(err, nats.ErrConnectionClosed) {
			return nil
		}
		nc.Close()
		return fmt.Errorf("drain the NATS connection: %w", err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for !nc.IsClosed() {
		select {
		case _, ok := <-closed:
			if !ok {
				closed = nil // closed with the connection: IsClosed says so now
			}
		case <-t.C:
			nc.Close()
			return fmt.Errorf("drain the NATS connection: not done after %s; closed it", timeout)
		}
	}
	return nil
}
