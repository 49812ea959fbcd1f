package kv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent/internal/protocol"
)

// The threads bucket keeps one revision of each key (History 1), so its
// stream holds each thread's record once, at the sequence of its last
// write: the stream is already an index of every tenant's threads by last
// write, kept by the server, with no second write to fall out of step and
// nothing to heal. Updated reads it from either end with batched direct
// gets filtered on the tenant's record subjects
// ("$KV.<bucket>.<tenant>.*": not the index keys below a thread, not
// other tenants), so a search reads the records it needs, not the
// bucket. Records reads the records of named threads, a batch of them
// per request, each with the sequence of its last write: the order of a
// search by updated_at among those threads alone.

const (
	// scanBatch is how many records one direct get answers at most.
	scanBatch = 512
	// scanMaxBytes bounds one answer's bytes (the server's own default is
	// its slow-consumer limit).
	scanMaxBytes = 1 << 20
	// walk's first window is eight stream sequences per record wanted,
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

// Updated calls visit with a tenant's thread records and the stream
// sequence of their last write, newest first by windows of the stream
// from its end (desc), or oldest first by batches from its start, within
// a window or batch in write order, and after each asks enough whether to
// stop: every record not visited yet was written, when desc, before
// every record visited, otherwise after. want, how many records the
// caller expects to need, sizes the first window. It reports whether it
// visited every record of the tenant. Oldest first, a record rewritten
// during the read may be visited twice, the second time at its new
// place: callers keep the later.
func (s *Threads) Updated(ctx context.Context, tenant string, desc bool, want int, visit func(t *protocol.Thread, seq uint64), enough func() bool) (bool, error) {
	if !protocol.ValidToken(tenant) {
		return true, nil
	}
	return s.walk(ctx, s.recordFilter(tenant), desc, want, func(msgs []scannedMsg) {
		for _, m := range msgs {
			if t := s.decodeRecord(m); t != nil {
				visit(t, m.seq)
			}
		}
	}, enough)
}

// errNoThreadID is a value of a thread record's key that decodes into no
// thread.
var errNoThreadID = errors.New("no thread_id")

// threadRecord refuses a decoded value that is no thread record.
func threadRecord(t *protocol.Thread) error {
	if t.ThreadID == "" {
		return errNoThreadID
	}
	return nil
}

// decodeRecord decodes a thread record read from the stream, counting it
// read; nil for a deletion or what is no thread record.
func (s *Threads) decodeRecord(m scannedMsg) *protocol.Thread {
	if m.deleted {
		return nil
	}
	s.read.Add(1)
	var t protocol.Thread
	err := decodeExact(m.data, &t)
	if err == nil {
		err = threadRecord(&t)
	}
	if err != nil {
		s.skips.skip(strings.TrimPrefix(m.subject, "$KV."+s.bucket+"."), err)
		return nil
	}
	return &t
}

// walk is how Updated and Created read the bucket's stream from either
// end: it calls window with the messages of filter newest first, by
// windows of the stream from its end (desc; the first window eight
// sequences per message wanted, within bounds, each further one four
// times the last), or oldest first, by batches from its start (each as
// many messages as one answer holds: the server counts what is pending
// after a batch from its subject totals when the batch starts at the
// stream's first sequence, and by reading blocks when it starts further
// on, so the first batch is cheap, and it usually holds the page). A
// window's or batch's messages come in stream order. After each, walk
// asks enough whether to stop, and it reports whether it read every
// message of filter.
func (s *Threads) walk(ctx context.Context, filter string, desc bool, want int, window func([]scannedMsg), enough func() bool) (bool, error) {
	first, last, err := s.streamBounds(ctx)
	if err != nil {
		return false, err
	}
	if last == 0 {
		return true, nil
	}
	if !desc {
		for seq := first; ; {
			msgs, more, err := s.directBatch(ctx, filter, seq)
			if err != nil {
				return false, err
			}
			if len(msgs) > 0 {
				seq = msgs[len(msgs)-1].seq + 1
			}
			window(msgs)
			if !more || len(msgs) == 0 {
				return true, nil
			}
			if enough() {
				return false, nil
			}
		}
	}
	w := uint64(min(max(8*want, minWindow), maxFirstWindow))
	lo, hi := first, last+1 // the part of the stream not read yet: [lo, hi)
	for lo < hi {
		from := lo
		if hi-lo > w {
			from = hi - w
		}
		var got []scannedMsg
		if err := s.readRaw(ctx, filter, from, hi, func(m scannedMsg) { got = append(got, m) }); err != nil {
			return false, err
		}
		window(got)
		hi = from
		if lo >= hi {
			return true, nil
		}
		if enough() {
			return false, nil
		}
		w *= 4
	}
	return true, nil
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
	return s.recordSubject(tenant, "*")
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
	return s.direct(ctx, map[string]any{"seq": seq, "next_by_subj": filter, "batch": scanBatch, "max_bytes": scanMaxBytes})
}

// recordsBatch is how many records Records asks for in one request (the
// server answers at most 1,024 subjects in one).
const recordsBatch = 512

// Records calls visit with the records of tenant's threads named in ids
// and the stream sequence of their last write, a batch of threads per
// request (a direct get of each subject's last message), in no
// particular order; a thread without a record is skipped, a record that
// does not decode is an error (as for Get). It reads those records only.
func (s *Threads) Records(ctx context.Context, tenant string, ids []string, visit func(t *protocol.Thread, seq uint64)) error {
	if !protocol.ValidToken(tenant) {
		return nil
	}
	var subjects []string
	for _, id := range ids {
		if protocol.ValidToken(id) {
			subjects = append(subjects, s.recordSubject(tenant, id))
		}
	}
	for len(subjects) > 0 {
		n := min(len(subjects), recordsBatch)
		batch := subjects[:n]
		msgs, more, err := s.direct(ctx, map[string]any{"multi_last": batch, "batch": n, "max_bytes": scanMaxBytes})
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.deleted {
				continue
			}
			s.read.Add(1)
			var t protocol.Thread
			if err := decodeExact(m.data, &t); err != nil {
				return fmt.Errorf("decode %s: %w", strings.TrimPrefix(m.subject, "$KV."+s.bucket+"."), err)
			}
			if t.ThreadID != "" {
				visit(&t, m.seq)
			}
		}
		if !more || len(msgs) == 0 {
			subjects = subjects[n:]
			continue
		}
		// The answer filled its bytes: ask again for the subjects it
		// did not hold.
		got := make(map[string]bool, len(msgs))
		for _, m := range msgs {
			got[m.subject] = true
		}
		rest := subjects[n:]
		subjects = slices.DeleteFunc(slices.Clone(batch), func(subj string) bool { return got[subj] })
		subjects = append(subjects, rest...)
	}
	return nil
}

// recordSubject is the subject of a thread's record.
func (s *Threads) recordSubject(tenant, thread string) string {
	return "$KV." + s.bucket + "." + tenant + "." + thread
}

// direct sends a direct get request to the bucket's stream and returns
// the messages it answers, and whether the server counts more pending
// after them.
func (s *Threads) direct(ctx context.Context, request map[string]any) ([]scannedMsg, bool, error) {
	ctx, cancel := bound(ctx)
	defer cancel()
	nc := s.js.Conn()
	req, _ := json.Marshal(request)
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
