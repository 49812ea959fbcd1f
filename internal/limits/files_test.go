package limits

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/files"
)

// A tenant's workdirs, all threads together, hold at most max_file_bytes:
// a write over it is refused and stores nothing; shrinking and removing
// give bytes back; other tenants are not counted.
func TestFileQuotaAcrossThreads(t *testing.T) {
	l, js := open(t, Policy{Tenants: map[string]Tenant{"acme": {MaxFileBytes: 1000}}})
	ctx := context.Background()
	n := bus.DefaultNames()
	store, err := js.ObjectStore(ctx, n.FilesBucket())
	if err != nil {
		t.Fatal(err)
	}
	index, err := js.KeyValue(ctx, n.ThreadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	wd := func(tenant, thread string) files.Workdir {
		return l.Files(files.NewObjectStore(store, index, tenant, thread), tenant)
	}
	t1, t2 := wd("acme", "t1"), wd("acme", "t2")
	if _, ok := files.VersionedOf(t1); !ok {
		t.Fatal("a workdir with a quota hides its versioned backend: its files would not follow the thread's checkpoints")
	}
	if err := t1.Write(ctx, "/a.txt", make([]byte, 600)); err != nil {
		t.Fatal(err)
	}
	err = t2.Write(ctx, "/b.txt", make([]byte, 500))
	if !errors.Is(err, files.ErrQuota) || !strings.Contains(err.Error(), "quota of 1000 bytes") {
		t.Fatalf("write over the tenant's quota: %v", err)
	}
	if _, err := t2.Stat(ctx, "/b.txt"); !errors.Is(err, files.ErrNotFound) {
		t.Fatalf("the refused file was stored: %v", err)
	}
	if err := t1.Write(ctx, "/a.txt", make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if err := t2.Write(ctx, "/b.txt", make([]byte, 500)); err != nil {
		t.Fatalf("write after shrinking a file: %v", err)
	}
	if err := t2.Remove(ctx, "/b.txt"); err != nil {
		t.Fatal(err)
	}
	if got, err := l.FileBytes(ctx, "acme"); err != nil || got != 100 {
		t.Fatalf("counted %d bytes (%v), want 100", got, err)
	}
	if err := wd("globex", "t1").Write(ctx, "/big.txt", make([]byte, 5000)); err != nil {
		t.Fatalf("a tenant without a quota: %v", err)
	}
}
