package kv

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/protocol"
)

// TestThreadRecordsByID: Records reads the named threads' records, more
// than one request holds (by count and by bytes: 700 records of about
// 4 KiB, over the 1 MiB an answer carries), each once with the sequence
// of its last write, skips a thread without a record and an invalid id,
// never reads another tenant's, and reports a record that does not
// decode.
func TestThreadRecordsByID(t *testing.T) {
	s := openStores(t)
	ctx := context.Background()
	const n = 700
	pad := strings.Repeat("x", 4000)
	var ids []string
	for i := range n {
		th := indexThread("ta", fmt.Sprintf("h%03d", i), "")
		th.Metadata = map[string]any{"pad": pad}
		if _, err := s.Threads.Put(ctx, th, 0); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, th.ThreadID)
	}
	if _, err := s.Threads.Put(ctx, indexThread("tb", "h001", ""), 0); err != nil {
		t.Fatal(err)
	}
	// h005 written again: its last write is the newest.
	if _, _, err := s.Threads.Mutate(ctx, "ta", "h005", func(th *protocol.Thread) error {
		th.Metadata["again"] = true
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	seqs := map[string]uint64{}
	before := s.Threads.RecordsRead()
	err := s.Threads.Records(ctx, "ta", append(slices.Clone(ids), "missing", "bad.id"), func(th *protocol.Thread, seq uint64) {
		if th.Tenant != "ta" {
			t.Errorf("read %s of tenant %s", th.ThreadID, th.Tenant)
		}
		if _, dup := seqs[th.ThreadID]; dup {
			t.Errorf("%s visited twice", th.ThreadID)
		}
		seqs[th.ThreadID] = seq
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seqs) != n {
		t.Fatalf("visited %d of %d records", len(seqs), n)
	}
	if read := s.Threads.RecordsRead() - before; read != n {
		t.Fatalf("read %d records for %d threads", read, n)
	}
	for id, seq := range seqs {
		if id != "h005" && seq >= seqs["h005"] {
			t.Fatalf("%s at %d after h005 (%d), written again last", id, seq, seqs["h005"])
		}
	}
	if _, err := s.Threads.js.Publish(ctx, "$KV."+s.Threads.bucket+".ta.h007", []byte("not a thread")); err != nil {
		t.Fatal(err)
	}
	if err := s.Threads.Records(ctx, "ta", []string{"h006", "h007"}, func(*protocol.Thread, uint64) {}); err == nil || !strings.Contains(err.Error(), "ta.h007") {
		t.Fatalf("an undecodable record: %v", err)
	}
}
