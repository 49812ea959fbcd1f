package files_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/natstest"
)

func versioned(t *testing.T, w files.Workdir) files.Versioned {
	t.Helper()
	v, ok := files.VersionedOf(w)
	if !ok {
		t.Fatal("the object store workdir is not versioned")
	}
	return v
}

func readString(t *testing.T, w files.Workdir, p string) string {
	t.Helper()
	data, err := w.Read(context.Background(), p)
	if errors.Is(err, files.ErrNotFound) {
		return "<none>"
	}
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	return string(data)
}

// A snapshot names each file's content by hash; checking an earlier
// snapshot out brings its files back, and a later one again, without
// storing any content; a path changed since the snapshot checked out
// from keeps its change.
func TestObjectStore_CheckoutMovesBetweenSnapshots(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	natstest.Provision(t, nc, bus.Settings{})
	store, index := objectStoreHandles(t, nc)
	ctx := context.Background()
	w := files.NewObjectStore(store, index, "default", "h1")
	v := versioned(t, w)

	must(t, w.Write(ctx, "/a.txt", []byte("first")))
	first, err := v.Snapshot(ctx)
	must(t, err)
	if first["/a.txt"].Hash != files.ContentHash([]byte("first")) {
		t.Fatalf("snapshot = %+v", first)
	}
	must(t, w.Write(ctx, "/a.txt", []byte("second")))
	must(t, w.Write(ctx, "/b.txt", []byte("b")))
	second, err := v.Snapshot(ctx)
	must(t, err)
	if got := files.Diff(first, second); len(got) != 2 || got[0].Path != "/a.txt" || got[1].Path != "/b.txt" {
		t.Fatalf("diff = %+v", got)
	}

	if n, err := v.Checkout(ctx, second, first); err != nil || n != 2 {
		t.Fatalf("checkout back = %d, %v", n, err)
	}
	if a, b := readString(t, w, "/a.txt"), readString(t, w, "/b.txt"); a != "first" || b != "<none>" {
		t.Fatalf("after checking the first out: a=%q b=%q", a, b)
	}
	if n, err := v.Checkout(ctx, first, second); err != nil || n != 2 {
		t.Fatalf("checkout forward = %d, %v", n, err)
	}
	if a, b := readString(t, w, "/a.txt"), readString(t, w, "/b.txt"); a != "second" || b != "b" {
		t.Fatalf("after checking the second out: a=%q b=%q", a, b)
	}

	// Changes since "second": a changed again, c new. Checking "first"
	// out from "second" takes b away and keeps both changes.
	must(t, w.Write(ctx, "/a.txt", []byte("mine")))
	must(t, w.Write(ctx, "/c.txt", []byte("c")))
	if _, err := v.Checkout(ctx, second, first); err != nil {
		t.Fatal(err)
	}
	if a, b, c := readString(t, w, "/a.txt"), readString(t, w, "/b.txt"), readString(t, w, "/c.txt"); a != "mine" || b != "<none>" || c != "c" {
		t.Fatalf("a=%q b=%q c=%q: a change made since the snapshot was undone", a, b, c)
	}
}

// Never a listed file without content: a checkout that names content the
// store does not hold leaves that file out and says so.
func TestObjectStore_CheckoutNeverListsMissingContent(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	natstest.Provision(t, nc, bus.Settings{})
	store, index := objectStoreHandles(t, nc)
	ctx := context.Background()
	w := files.NewObjectStore(store, index, "default", "h1")
	v := versioned(t, w)
	must(t, w.Write(ctx, "/kept.txt", []byte("kept")))
	now, err := v.Snapshot(ctx)
	must(t, err)
	to := now.Clone()
	to.Apply([]files.Change{
		{Path: "/gone.txt", Hash: files.ContentHash([]byte("never stored")), Size: 12},
		{Path: "/bad.txt", Hash: "../../acme/h1/x", Size: 1},
	})
	n, err := v.Checkout(ctx, now, to)
	if !errors.Is(err, files.ErrContentMissing) || n != 0 {
		t.Fatalf("checkout = %d, %v; want ErrContentMissing", n, err)
	}
	infos, err := w.List(ctx, "/")
	must(t, err)
	if len(infos) != 1 || infos[0].Path != "/kept.txt" {
		t.Fatalf("listed %+v", infos)
	}
	if _, err := v.ReadContent(ctx, "../x"); !errors.Is(err, files.ErrNotFound) {
		t.Errorf("ReadContent of a bad hash = %v", err)
	}
}

// A file stored before content was kept by hash (its object under its
// path, an index entry without a hash) is read as before; written again,
// it moves to content by hash and the old object goes. It is not
// versioned until then.
func TestObjectStore_FileFromBeforeHashes(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	natstest.Provision(t, nc, bus.Settings{})
	store, index := objectStoreHandles(t, nc)
	ctx := context.Background()
	if _, err := store.PutBytes(ctx, "default/h1/old.txt", []byte("old")); err != nil {
		t.Fatal(err)
	}
	entry := `{"path":"/old.txt","size":3,"mod_time":"2026-01-01T00:00:00Z"}`
	if _, err := index.Put(ctx, files.IndexKey("default", "h1", "/old.txt"), []byte(entry)); err != nil {
		t.Fatal(err)
	}
	w := files.NewObjectStore(store, index, "default", "h1")
	if got := readString(t, w, "/old.txt"); got != "old" {
		t.Fatalf("read %q", got)
	}
	snap, err := versioned(t, w).Snapshot(ctx)
	must(t, err)
	if len(snap) != 0 {
		t.Errorf("snapshot holds an unversioned file: %+v", snap)
	}
	must(t, w.Write(ctx, "/old.txt", []byte("new")))
	if got := readString(t, w, "/old.txt"); got != "new" {
		t.Fatalf("read %q", got)
	}
	if _, err := store.GetInfo(ctx, "default/h1/old.txt"); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Errorf("the path object stayed: %v", err)
	}
}

// Collect deletes a tenant's content nothing names, stored before the
// cutoff; what is named, newer, or another tenant's stays.
func TestCollect(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	natstest.Provision(t, nc, bus.Settings{})
	store, index := objectStoreHandles(t, nc)
	ctx := context.Background()
	js, err := jetstream.New(nc)
	must(t, err)
	w := files.NewObjectStore(store, index, "default", "h1")
	other := files.NewObjectStore(store, index, "acme", "h1")
	for _, s := range []string{"named", "unnamed"} {
		must(t, w.Write(ctx, "/"+s, []byte(s)))
		must(t, other.Write(ctx, "/"+s, []byte(s)))
	}
	must(t, w.Remove(ctx, "/unnamed"))
	must(t, other.Remove(ctx, "/unnamed"))
	named, unnamed := files.ContentHash([]byte("named")), files.ContentHash([]byte("unnamed"))
	keep := func(thread, hash string) bool { return thread == "h1" && hash == named }
	bucket := bus.DefaultNames().FilesBucket()

	if n, err := files.Collect(ctx, js, bucket, "default", keep, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("collect of new content = %d, %v", n, err)
	}
	n, err := files.Collect(ctx, js, bucket, "default", keep, time.Now().Add(time.Second))
	if err != nil || n != 1 {
		t.Fatalf("collect = %d, %v; want 1", n, err)
	}
	if _, err := store.GetInfo(ctx, files.ContentObject("default", "h1", unnamed)); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Errorf("unnamed content stayed: %v", err)
	}
	if got := readString(t, w, "/named"); got != "named" {
		t.Errorf("named file reads %q", got)
	}
	if _, err := store.GetInfo(ctx, files.ContentObject("acme", "h1", unnamed)); err != nil {
		t.Errorf("another tenant's content went: %v", err)
	}
	// Stored again after it was collected: a plain write.
	must(t, w.Write(ctx, "/again", []byte("unnamed")))
	if got := readString(t, w, "/again"); got != "unnamed" {
		t.Errorf("read %q", got)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
