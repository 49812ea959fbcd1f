package natstest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Lockstep is a TCP proxy between one NATS client and a server that can
// hold back every message the server sends the client (MSG and HMSG:
// deliveries, request replies, publish acks) and let them through in
// rounds. A client that must wait for an answer before it sends its next
// request needs one round per wait, so the rounds a piece of work takes
// count its sequential round trips to the server: its stages. Everything
// else (INFO, PING, PONG, +OK, -ERR, and whatever the client sends)
// passes at once.
//
// The rounds are cut by quiet: a round is let through once nothing has
// moved either way for a while. A client that is slow to send a request
// it could have sent with the round before (a loaded machine) makes a
// round more, never fewer, so a count is an upper bound of the stages,
// exact when the client kept up.
type Lockstep struct {
	t      testing.TB
	ln     net.Listener
	target string

	mu       sync.Mutex
	holding  bool
	held     [][]byte
	client   net.Conn // the connection to the client, written under mu
	activity time.Time
	pubs     []Pub
	round    int
	conns    []net.Conn
}

// Pub is a message the client published, with the round it was sent in
// (the number of rounds let through before it).
type Pub struct {
	Subject string
	Data    []byte
	Round   int
}

// NewLockstep listens on a loopback port and proxies each connection to
// target (host:port or nats:// URL). It closes when the test ends.
func NewLockstep(t testing.TB, target string) *Lockstep {
	t.Helper()
	if u, ok := bytes.CutPrefix([]byte(target), []byte("nats://")); ok {
		target = string(u)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Lockstep{t: t, ln: ln, target: target}
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// URL is the proxy's NATS URL.
func (p *Lockstep) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *Lockstep) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
}

func (p *Lockstep) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.client = c
		p.mu.Unlock()
		go p.fromClient(c, s)
		go p.fromServer(s, c)
	}
}

// fromClient forwards what the client sends, noting its publishes.
func (p *Lockstep) fromClient(c, s net.Conn) {
	defer s.Close()
	r := bufio.NewReaderSize(c, 64<<10)
	for {
		frame, subject, data, err := readFrame(r, false)
		if err != nil {
			return
		}
		p.mu.Lock()
		p.activity = time.Now()
		if subject != "" {
			p.pubs = append(p.pubs, Pub{Subject: subject, Data: data, Round: p.round})
		}
		p.mu.Unlock()
		if _, err := s.Write(frame); err != nil {
			return
		}
	}
}

// fromServer forwards what the server sends, holding messages while the
// proxy holds.
func (p *Lockstep) fromServer(s, c net.Conn) {
	defer c.Close()
	r := bufio.NewReaderSize(s, 64<<10)
	for {
		frame, subject, _, err := readFrame(r, true)
		if err != nil {
			return
		}
		p.mu.Lock()
		p.activity = time.Now()
		if subject != "" && p.holding {
			p.held = append(p.held, frame)
			p.mu.Unlock()
			continue
		}
		_, err = c.Write(frame)
		p.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// readFrame reads one protocol frame: a control line, and for a message
// (PUB/HPUB from a client, MSG/HMSG from a server) its payload. subject is
// set for messages only; data is the payload of a PUB or HPUB (headers
// included).
func readFrame(r *bufio.Reader, server bool) (frame []byte, subject string, data []byte, err error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return nil, "", nil, err
	}
	fields := bytes.Fields(line)
	if len(fields) == 0 {
		return line, "", nil, nil
	}
	op := string(bytes.ToUpper(fields[0]))
	var size int
	switch {
	case !server && op == "PUB" && len(fields) >= 3, server && op == "MSG" && len(fields) >= 4:
		size, err = strconv.Atoi(string(fields[len(fields)-1]))
	case !server && op == "HPUB" && len(fields) >= 4, server && op == "HMSG" && len(fields) >= 5:
		size, err = strconv.Atoi(string(fields[len(fields)-1]))
	default:
		return line, "", nil, nil
	}
	if err != nil || size < 0 {
		return nil, "", nil, errors.New("lockstep: bad message size")
	}
	body := make([]byte, size+2)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, "", nil, err
	}
	frame = append(line, body...)
	return frame, string(fields[1]), body[:size], nil
}

// Hold starts holding the server's messages to the client; the round
// count starts at 0.
func (p *Lockstep) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holding, p.round, p.pubs = true, 0, nil
}

// Release stops holding and lets everything held through.
func (p *Lockstep) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holding = false
	p.flush()
}

// flush writes the held messages to the client, with p.mu held.
func (p *Lockstep) flush() {
	for _, f := range p.held {
		if p.client != nil {
			_, _ = p.client.Write(f)
		}
	}
	p.held = nil
}

// Pubs is what the client published since Hold.
func (p *Lockstep) Pubs() []Pub {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Pub(nil), p.pubs...)
}

// Rounds lets the held messages through round by round, each once
// nothing moved for quiet, until done reports true of a publish of the
// client, and returns the number of rounds let through before that
// publish. It gives up when ctx ends.
func (p *Lockstep) Rounds(ctx context.Context, quiet time.Duration, done func(Pub) bool) (int, error) {
	seen := 0
	for {
		p.mu.Lock()
		for ; seen < len(p.pubs); seen++ {
			if done(p.pubs[seen]) {
				round := p.pubs[seen].Round
				p.mu.Unlock()
				return round, nil
			}
		}
		idle := time.Since(p.activity)
		if idle >= quiet && len(p.held) > 0 {
			p.round++
			p.flush()
			p.activity = time.Now()
			idle = 0
		}
		p.mu.Unlock()
		wait := quiet - idle
		if wait < time.Millisecond {
			wait = time.Millisecond
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(min(wait, 10*time.Millisecond)):
		}
	}
}
