package kv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/protocol"
)

// The threads bucket keeps one revision of each key (History 1), so its
// stream holds each thread's record once, at the sequence of its last
// write: the stream is already an index of every tenant's threads by last
// write, kept by the server, with no second write to fall out of step and
// nothing to heal. Recent reads it from the newest end with batched
// direct gets filtered on the tenant's record subjects ("$KV.<bucket>.<tenant>.*": not the run index keys below a
// thread, not other tenants), so a search reads the records it needs,
// not the bucket.

const (
	// scanBatch is how many records one direct get answers at most.
	scanBatch = 512
	// scanMaxBytes bounds one answer's bytes (the server's own default is
	// its slow-consumer limit).
	scanMaxBytes = 1 << 20
	// Recent's first window is eight stream sequences per record wanted,
	// within these bounds; each further window is four times the last.
	minWindow, maxFirstWindow = 64, 4096
)

// streamBounds returns the first and last sequences of the bucket's
// stream, from its leader: the last write a search must see.
func (s *Threads) streamBounds(ctx context.Context) (first, last uint64, err error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	st, err := s.js.Stream(ctx, "KV_"+s.bucket)
	if err != nil {
		return 0, 0, err
	}
	// The lookup reads the stream's info: its state is current.
	info := st.CachedInfo()
	return info.State.FirstSeq, info.State.LastSeq, nil
}

// Recent calls visit with a tenant's thread records and the stream
// sequence of their last write, by windows of the stream from its newest
// end (within a window in write order), and after each window asks
// enough whether to stop: every record not visited yet was written
// before every record visited. want, how many records the caller
// expects to need, sizes the first window. It reports whether it
// visited every record of the tenant.
func (s *Threads) Recent(ctx context.Context, tenant string, want int, visit func(t *protocol.Thread, seq uint64), enough func() bool) (bool, error) {
	if !protocol.ValidToken(tenant) {
		return true, nil
	}
	first, last, err := s.streamBounds(ctx)
	if err != nil {
		return false, err
	}
	if last == 0 {
		return true, nil
	}
	filter := s.recordFilter(tenant)
	hi, w := uint64(0), uint64(min(max(8*want, minWindow), maxFirstWindow)) // hi 0: the first window reads to the stream's end
	for {
		lo := first
		top := last + 1
		if hi != 0 {
			top = hi
		}
		if top > first+w {
			lo = top - w
		}
		if err := s.readRange(ctx, filter, lo, hi, visit); err != nil {
			return false, err
		}
		if lo <= first {
			return true, nil
		}
		if enough() {
			return false, nil
		}
		hi, w = lo, w*4
	}
}

// Scan calls visit with every thread record of a tenant. It reads them
// through a watch (List), not batched direct gets: the server counts what
// is pending after each batch of a direct get, from its start to the
// stream's end, which over a whole tenant grows with the square of its
// threads.
func (s *Threads) Scan(ctx context.Context, tenant string, visit func(*protocol.Thread)) error {
	if !protocol.ValidToken(tenant) {
		return nil
	}
	all, err := s.List(ctx, tenant)
	if err != nil {
		return err
	}
	for _, t := range all {
		if t.ThreadID != "" {
			visit(t)
		}
	}
	return nil
}

func (s *Threads) recordFilter(tenant string) string {
	return "$KV." + s.bucket + "." + tenant + ".*"
}

// readRange visits the records of filter stored at sequences lo to hi-1
// (hi 0: to the end).
func (s *Threads) readRange(ctx context.Context, filter string, lo, hi uint64, visit func(*protocol.Thread, uint64)) error {
	for seq := lo; hi == 0 || seq < hi; {
		msgs, more, err := s.directBatch(ctx, filter, seq)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if hi != 0 && m.seq >= hi {
				return nil
			}
			seq = m.seq + 1
			if m.deleted {
				continue
			}
			s.read.Add(1)
			var t protocol.Thread
			if decodeExact(m.data, &t) == nil && t.ThreadID != "" {
				visit(&t, m.seq)
			}
		}
		if !more || len(msgs) == 0 {
			return nil
		}
	}
	return nil
}

type scannedMsg struct {
	subject string
	seq     uint64
	deleted bool
	data    []byte
}

// directBatch asks the stream for the messages of filter from seq on, at
// most scanBatch of them, and reports whether more may follow (the
// server's count of those pending after the batch).
func (s *Threads) directBatch(ctx context.Context, filter string, seq uint64) ([]scannedMsg, bool, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	nc := s.js.Conn()
	req, _ := json.Marshal(map[string]any{"seq": seq, "next_by_subj": filter, "batch": scanBatch, "max_bytes": scanMaxBytes})
	inbox := nc.NewRespInbox()
	ch := make(chan *nats.Msg, scanBatch+1)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, false, err
	}
	defer sub.Unsubscribe()
	prefix := s.js.Options().APIPrefix
	if prefix == "" {
		prefix = "$JS.API."
	}
	if !strings.HasSuffix(prefix, ".") {
		prefix += "."
	}
	if err := nc.PublishRequest(prefix+"DIRECT.GET.KV_"+s.bucket, inbox, req); err != nil {
		return nil, false, err
	}
	var out []scannedMsg
	for {
		select {
		case <-ctx.Done():
			return nil, false, fmt.Errorf("read threads: %w", ctx.Err())
		case m := <-ch:
			switch m.Header.Get("Status") {
			case "":
			case "404":
				return out, false, nil // nothing at or after seq
			case "204":
				pending, _ := strconv.ParseUint(m.Header.Get("Nats-Num-Pending"), 10, 64)
				return out, pending > 0, nil
			default:
				return nil, false, errors.New("read threads: direct get answered " + m.Header.Get("Status") + " " + m.Header.Get("Description"))
			}
			n, err := strconv.ParseUint(m.Header.Get("Nats-Sequence"), 10, 64)
			if err != nil {
				return nil, false, fmt.Errorf("read threads: a message without its sequence")
			}
			op := m.Header.Get("KV-Operation")
			out = append(out, scannedMsg{subject: m.Header.Get("Nats-Subject"), seq: n, deleted: op == "DEL" || op == "PURGE", data: m.Data})
		}
	}
}
