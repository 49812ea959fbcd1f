package files_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/natstest"
)

// backend opens a fresh workdir of one kind for a test.
type backend struct {
	name string
	open func(t *testing.T, opts ...files.Option) files.Workdir
}

// objectStoreHandles opens the files bucket and the threads bucket on a
// connection, as a worker does once at start.
func objectStoreHandles(t *testing.T, nc *nats.Conn) (jetstream.ObjectStore, jetstream.KeyValue) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	names := bus.DefaultNames()
	store, err := js.ObjectStore(ctx, names.FilesBucket())
	if err != nil {
		t.Fatal(err)
	}
	index, err := js.KeyValue(ctx, names.ThreadsBucket())
	if err != nil {
		t.Fatal(err)
	}
	return store, index
}

func backends() []backend {
	return []backend{
		{"memory", func(t *testing.T, _ ...files.Option) files.Workdir { return files.NewMemory() }},
		{"local", func(t *testing.T, opts ...files.Option) files.Workdir {
			w, err := files.NewLocal(t.TempDir(), "default", "h1", opts...)
			if err != nil {
				t.Fatal(err)
			}
			return w
		}},
		{"objectstore", func(t *testing.T, opts ...files.Option) files.Workdir {
			srv := natstest.Start(t)
			nc := srv.Connect()
			natstest.Provision(t, nc, bus.Settings{})
			store, index := objectStoreHandles(t, nc)
			return files.NewObjectStore(store, index, "default", "h1", opts...)
		}},
	}
}

func TestContract(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			w := b.open(t)
			t.Run("read_write_stat", func(t *testing.T) { contractReadWrite(t, w) })
			t.Run("implied_directories", func(t *testing.T) { contractDirectories(t, w) })
			t.Run("errors", func(t *testing.T) { contractErrors(t, w) })
			t.Run("confinement", func(t *testing.T) { contractConfinement(t, w) })
		})
	}
}

func contractReadWrite(t *testing.T, w files.Workdir) {
	ctx := context.Background()
	before := time.Now().Add(-2 * time.Second)
	if err := w.Write(ctx, "/rw/a.txt", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	// A relative path is taken from the root; "." and ".." inside are fine.
	got, err := w.Read(ctx, "rw/./x/../a.txt")
	if err != nil || string(got) != "hello" {
		t.Fatalf("Read = %q, %v", got, err)
	}
	if err := w.Write(ctx, "/rw/a.txt", []byte("replaced")); err != nil {
		t.Fatal(err)
	}
	if got, _ := w.Read(ctx, "/rw/a.txt"); string(got) != "replaced" {
		t.Errorf("after overwrite: %q", got)
	}
	info, err := w.Stat(ctx, "/rw/a.txt")
	if err != nil || info.Path != "/rw/a.txt" || info.Size != 8 || info.IsDir || info.ModTime.Before(before) {
		t.Errorf("Stat = %+v, %v", info, err)
	}
	if err := w.Write(ctx, "/rw/empty", nil); err != nil {
		t.Fatal(err)
	}
	if got, err := w.Read(ctx, "/rw/empty"); err != nil || len(got) != 0 {
		t.Errorf("empty file: %q, %v", got, err)
	}
	// Unicode names and a long (but legal) path.
	long := "/rw/" + strings.Repeat("d", 200) + "/" + strings.Repeat("é", 100) + "/" + strings.Repeat("f", 200) + ".txt"
	if err := w.Write(ctx, long, []byte("deep")); err != nil {
		t.Fatalf("long path: %v", err)
	}
	if got, err := w.Read(ctx, long); err != nil || string(got) != "deep" {
		t.Errorf("long path read: %q, %v", got, err)
	}
	if err := w.Remove(ctx, long); err != nil {
		t.Fatal(err)
	}
	if err := w.Remove(ctx, "/rw/a.txt"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Read(ctx, "/rw/a.txt"); !errors.Is(err, files.ErrNotFound) {
		t.Errorf("read after remove: %v", err)
	}
	if err := w.Remove(ctx, "/rw/empty"); err != nil {
		t.Fatal(err)
	}
}

func contractDirectories(t *testing.T, w files.Workdir) {
	ctx := context.Background()
	for p, content := range map[string]string{
		"/d/e/f.txt": "f", "/d/g.txt": "gg", "/d/e/h/i.txt": "iii", "/top.txt": "t",
	} {
		if err := w.Write(ctx, p, []byte(content)); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range []string{"/", "/d", "/d/e", "/d/e/h"} {
		info, err := w.Stat(ctx, dir)
		if err != nil || !info.IsDir {
			t.Errorf("Stat(%s) = %+v, %v; want a directory", dir, info, err)
		}
	}
	list, err := w.List(ctx, "/d")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, i := range list {
		s := i.Path
		if i.IsDir {
			s += "/"
		}
		got = append(got, s)
	}
	if want := []string{"/d/e/", "/d/g.txt"}; !reflect.DeepEqual(got, want) {
		t.Errorf("List(/d) = %v, want %v", got, want)
	}
	if list[1].Size != 2 {
		t.Errorf("List size = %d", list[1].Size)
	}
	root, err := w.List(ctx, "/")
	if err != nil || len(root) < 2 {
		t.Fatalf("List(/) = %v, %v", root, err)
	}
	var walked []string
	if err := w.Walk(ctx, "/d", func(i files.Info) error {
		if i.IsDir {
			t.Errorf("Walk yielded a directory %s", i.Path)
		}
		walked = append(walked, i.Path)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"/d/e/f.txt", "/d/e/h/i.txt", "/d/g.txt"}; !reflect.DeepEqual(walked, want) {
		t.Errorf("Walk(/d) = %v, want %v", walked, want)
	}
	// Walk stops with fn's error.
	stop := errors.New("stop")
	n := 0
	if err := w.Walk(ctx, "/", func(files.Info) error { n++; return stop }); !errors.Is(err, stop) || n != 1 {
		t.Errorf("Walk did not stop: %v after %d", err, n)
	}
	// A missing directory has no files.
	if err := w.Walk(ctx, "/nowhere", func(i files.Info) error { t.Errorf("walked %s", i.Path); return nil }); err != nil {
		t.Errorf("Walk(/nowhere) = %v", err)
	}
	// Directories exist through their files.
	for _, p := range []string{"/d/e/f.txt", "/d/e/h/i.txt"} {
		if err := w.Remove(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Stat(ctx, "/d/e"); !errors.Is(err, files.ErrNotFound) {
		t.Errorf("Stat(/d/e) after removing its files = %v, want ErrNotFound", err)
	}
	if _, err := w.List(ctx, "/d/e"); !errors.Is(err, files.ErrNotFound) {
		t.Errorf("List(/d/e) after removing its files = %v, want ErrNotFound", err)
	}
	for _, p := range []string{"/d/g.txt", "/top.txt"} {
		if err := w.Remove(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
}

func contractErrors(t *testing.T, w files.Workdir) {
	ctx := context.Background()
	if err := w.Write(ctx, "/e/file.txt", []byte("x")); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Remove(ctx, "/e/file.txt") }()
	check := func(what string, err, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	}
	_, err := w.Read(ctx, "/e/missing.txt")
	check("Read missing", err, files.ErrNotFound)
	_, err = w.Read(ctx, "/e/file.txt/below")
	check("Read below a file", err, files.ErrNotFound)
	_, err = w.Stat(ctx, "/e/missing.txt")
	check("Stat missing", err, files.ErrNotFound)
	_, err = w.List(ctx, "/e/missing")
	check("List missing", err, files.ErrNotFound)
	check("Remove missing", w.Remove(ctx, "/e/missing.txt"), files.ErrNotFound)
	_, err = w.Read(ctx, "/e")
	check("Read a directory", err, files.ErrIsDir)
	_, err = w.Read(ctx, "/")
	check("Read the root", err, files.ErrIsDir)
	check("Write over a directory", w.Write(ctx, "/e", []byte("x")), files.ErrIsDir)
	check("Remove a directory", w.Remove(ctx, "/e"), files.ErrIsDir)
	check("Write below a file", w.Write(ctx, "/e/file.txt/below", []byte("x")), files.ErrNotDir)
	_, err = w.List(ctx, "/e/file.txt")
	check("List a file", err, files.ErrNotDir)
	check("Write the root", w.Write(ctx, "/", []byte("x")), files.ErrBadPath)
	if got, _ := w.Read(ctx, "/e/file.txt"); string(got) != "x" {
		t.Errorf("a refused write changed the file: %q", got)
	}
}

// badPaths must be refused by every operation of every backend.
var badPaths = []string{
	"..",
	"../../etc/passwd",
	"/abs/../../x",
	"/a/../../x",
	"a\x00b",
	"/nul\x00/../x",
	`a\b`,
	`..\..\windows`,
	"/" + strings.Repeat("a/", files.MaxPathLen/2+1),
	"",
	"bad\xffutf8",
	"new\nline",
}

func contractConfinement(t *testing.T, w files.Workdir) {
	ctx := context.Background()
	for _, p := range badPaths {
		errs := map[string]error{}
		_, errs["Read"] = w.Read(ctx, p)
		errs["Write"] = w.Write(ctx, p, []byte("x"))
		_, errs["Stat"] = w.Stat(ctx, p)
		_, errs["List"] = w.List(ctx, p)
		errs["Walk"] = w.Walk(ctx, p, func(files.Info) error { return nil })
		errs["Remove"] = w.Remove(ctx, p)
		for op, err := range errs {
			if !errors.Is(err, files.ErrBadPath) {
				t.Errorf("%s(%q) = %v, want ErrBadPath", op, p, err)
			}
		}
	}
	// Nothing was written anywhere.
	if err := w.Walk(ctx, "/", func(i files.Info) error { t.Errorf("file %s after refused writes", i.Path); return nil }); err != nil {
		t.Fatal(err)
	}
}

func TestClean(t *testing.T) {
	for in, want := range map[string]string{
		"a.txt": "/a.txt", "/a/./b/": "/a/b", "/a/../b": "/b", "//x//y": "/x/y", ".": "/", "/": "/",
	} {
		if got, err := files.Clean(in); err != nil || got != want {
			t.Errorf("Clean(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	_, err := files.Clean("../../etc/passwd")
	if err == nil || !strings.Contains(err.Error(), "leaves the workdir") {
		t.Errorf("Clean(../../etc/passwd) = %v", err)
	}
	// Controls of every kind and the bidirectional overrides that make a
	// name display as another ("txt.exe" shown as "exe.txt").
	for _, bad := range []string{"/a\x00b", "/a\x1fb", "/a\x7fb", "/a\u0085b", "/report\u202etxt.exe", "/a\u2066b"} {
		if _, err := files.Clean(bad); !errors.Is(err, files.ErrBadPath) {
			t.Errorf("Clean(%q) = %v, want ErrBadPath", bad, err)
		}
	}
}

func TestSizeLimit(t *testing.T) {
	for _, b := range backends() {
		if b.name == "memory" {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			w := b.open(t, files.WithMaxFileBytes(1000))
			ctx := context.Background()
			if err := w.Write(ctx, "/ok", bytes.Repeat([]byte("x"), 1000)); err != nil {
				t.Fatal(err)
			}
			err := w.Write(ctx, "/big", bytes.Repeat([]byte("x"), 1001))
			if !errors.Is(err, files.ErrTooLarge) || !strings.Contains(err.Error(), "1000") {
				t.Errorf("Write over the limit = %v", err)
			}
			if _, err := w.Stat(ctx, "/big"); !errors.Is(err, files.ErrNotFound) {
				t.Errorf("a refused file exists: %v", err)
			}
		})
	}
}

func TestDefaultSizeLimit(t *testing.T) {
	w, err := files.NewLocal(t.TempDir(), "default", "h1")
	if err != nil {
		t.Fatal(err)
	}
	err = w.Write(context.Background(), "/huge", make([]byte, files.DefaultMaxFileBytes+1))
	if !errors.Is(err, files.ErrTooLarge) {
		t.Errorf("Write of 32 MiB + 1 = %v", err)
	}
}

// A symbolic link inside the thread's directory that points outside is
// never followed, whichever operation meets it.
func TestLocal_SymlinkOutsideIsRefused(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret.txt")
	if err := os.WriteFile(secret, []byte("top secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := files.NewLocal(root, "default", "h1")
	if err != nil {
		t.Fatal(err)
	}
	dir, ok := files.HostDir(w)
	if !ok || dir != filepath.Join(root, "default", "h1") {
		t.Fatalf("HostDir = %q, %v", dir, ok)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(outside, filepath.Join(dir, "out")))               // a directory outside
	must(os.Symlink(secret, filepath.Join(dir, "secret")))             // a file outside
	must(os.Symlink("../../../", filepath.Join(dir, "up")))            // relative, climbing out
	must(os.Symlink("/nonexistent/x", filepath.Join(dir, "dangling"))) // to nothing, outside
	must(os.WriteFile(filepath.Join(dir, "inside.txt"), []byte("in"), 0o600))
	must(os.Symlink("inside.txt", filepath.Join(dir, "alias.txt"))) // stays inside: fine

	ctx := context.Background()
	for _, p := range []string{"/out/secret.txt", "/secret", "/up/etc/passwd", "/out", "/dangling"} {
		if data, err := w.Read(ctx, p); !errors.Is(err, files.ErrBadPath) {
			t.Errorf("Read(%s) = %q, %v; want ErrBadPath", p, data, err)
		}
		if err := w.Write(ctx, p, []byte("pwned")); !errors.Is(err, files.ErrBadPath) {
			t.Errorf("Write(%s) = %v; want ErrBadPath", p, err)
		}
		if _, err := w.Stat(ctx, p); !errors.Is(err, files.ErrBadPath) {
			t.Errorf("Stat(%s) = %v; want ErrBadPath", p, err)
		}
		if _, err := w.List(ctx, p); !errors.Is(err, files.ErrBadPath) {
			t.Errorf("List(%s) = %v; want ErrBadPath", p, err)
		}
		if err := w.Remove(ctx, p); !errors.Is(err, files.ErrBadPath) {
			t.Errorf("Remove(%s) = %v; want ErrBadPath", p, err)
		}
	}
	if err := w.Write(ctx, "/out/new.txt", []byte("pwned")); !errors.Is(err, files.ErrBadPath) {
		t.Errorf("Write through a link = %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "new.txt")); !os.IsNotExist(err) {
		t.Errorf("a file was created outside the workdir: %v", err)
	}
	if _, err := os.Stat("/nonexistent/x"); !os.IsNotExist(err) {
		t.Errorf("the dangling link's target was created: %v", err)
	}
	if data, _ := os.ReadFile(secret); string(data) != "top secret" {
		t.Errorf("the secret outside changed: %q", data)
	}
	// Listings leave escaping links out and never walk through them.
	list, err := w.List(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, i := range list {
		names = append(names, i.Path)
	}
	if want := []string{"/alias.txt", "/inside.txt"}; !reflect.DeepEqual(names, want) {
		t.Errorf("List(/) = %v, want %v", names, want)
	}
	var walked []string
	if err := w.Walk(ctx, "/", func(i files.Info) error { walked = append(walked, i.Path); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := []string{"/alias.txt", "/inside.txt"}; !reflect.DeepEqual(walked, want) {
		t.Errorf("Walk(/) = %v, want %v", walked, want)
	}
	if data, err := w.Read(ctx, "/alias.txt"); err != nil || string(data) != "in" {
		t.Errorf("Read of a link inside = %q, %v", data, err)
	}
}

func TestLocal_NameTooLong(t *testing.T) {
	w, err := files.NewLocal(t.TempDir(), "default", "h1")
	if err != nil {
		t.Fatal(err)
	}
	err = w.Write(context.Background(), "/"+strings.Repeat("n", 300), []byte("x"))
	if !errors.Is(err, files.ErrBadPath) || !strings.Contains(err.Error(), "255") {
		t.Errorf("Write with a 300-byte name = %v", err)
	}
}

func TestLocal_ThreadsAreSeparate(t *testing.T) {
	root := t.TempDir()
	a, err := files.NewLocal(root, "default", "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := files.NewLocal(root, "default", "b")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := a.Write(ctx, "/x.txt", []byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Read(ctx, "/x.txt"); !errors.Is(err, files.ErrNotFound) {
		t.Errorf("thread b sees thread a's file: %v", err)
	}
	if _, err := files.NewLocal(root, "default", "../b"); err == nil {
		t.Error("NewLocal accepted a thread id with ..")
	}
	if _, err := files.NewLocal(root, "a/b", "h"); err == nil {
		t.Error("NewLocal accepted a tenant with a slash")
	}
}

// Any worker can continue any run: two workers on their own connections
// see the same files of a thread, and only that thread's.
func TestObjectStore_SharedAcrossConnections(t *testing.T) {
	srv := natstest.Start(t)
	nc1, nc2 := srv.Connect(), srv.Connect()
	natstest.Provision(t, nc1, bus.Settings{})
	s1, i1 := objectStoreHandles(t, nc1)
	s2, i2 := objectStoreHandles(t, nc2)
	w1 := files.NewObjectStore(s1, i1, "default", "h1")
	w2 := files.NewObjectStore(s2, i2, "default", "h1")
	other := files.NewObjectStore(s2, i2, "default", "h2")
	otherTenant := files.NewObjectStore(s2, i2, "acme", "h1")
	ctx := context.Background()

	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB: several chunks
	if err := w1.Write(ctx, "/notes/a.md", []byte("from worker 1")); err != nil {
		t.Fatal(err)
	}
	if err := w1.Write(ctx, "/big.bin", big); err != nil {
		t.Fatal(err)
	}
	if got, err := w2.Read(ctx, "/notes/a.md"); err != nil || string(got) != "from worker 1" {
		t.Fatalf("worker 2 reads %q, %v", got, err)
	}
	if got, err := w2.Read(ctx, "/big.bin"); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("worker 2 reads %d bytes, %v", len(got), err)
	}
	if err := w2.Write(ctx, "/notes/b.md", []byte("from worker 2")); err != nil {
		t.Fatal(err)
	}
	var paths []string
	if err := w1.Walk(ctx, "/", func(i files.Info) error { paths = append(paths, i.Path); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := []string{"/big.bin", "/notes/a.md", "/notes/b.md"}; !reflect.DeepEqual(paths, want) {
		t.Errorf("worker 1 walks %v, want %v", paths, want)
	}
	for name, w := range map[string]files.Workdir{"another thread": other, "another tenant": otherTenant} {
		if list, err := w.List(ctx, "/"); err != nil || len(list) != 0 {
			t.Errorf("%s lists %v, %v", name, list, err)
		}
		if _, err := w.Read(ctx, "/notes/a.md"); !errors.Is(err, files.ErrNotFound) {
			t.Errorf("%s reads the file: %v", name, err)
		}
	}
	if err := w2.Remove(ctx, "/notes/a.md"); err != nil {
		t.Fatal(err)
	}
	if _, err := w1.Read(ctx, "/notes/a.md"); !errors.Is(err, files.ErrNotFound) {
		t.Errorf("worker 1 still reads a removed file: %v", err)
	}

	// The layout is the documented one: the content under
	// "<tenant>/<thread>//sha256/<hash>", the index entry under its
	// hashed key, naming the hash.
	hash := files.ContentHash([]byte("from worker 2"))
	if data, err := s1.GetBytes(ctx, "default/h1//sha256/"+hash); err != nil || string(data) != "from worker 2" {
		t.Errorf("object default/h1//sha256/%s = %q, %v", hash, data, err)
	}
	e, err := i1.Get(ctx, files.IndexKey("default", "h1", "/notes/b.md"))
	if err != nil || !strings.Contains(string(e.Value()), `"path":"/notes/b.md"`) || !strings.Contains(string(e.Value()), hash) {
		t.Errorf("index entry: %v", err)
	}
	if k := files.IndexKey("default", "h1", "/x"); !strings.HasPrefix(k, "default.h1.file.") || len(k) != len("default.h1.file.")+32 {
		t.Errorf("IndexKey = %q", k)
	}
}

// An object without an index entry (a write that crashed between the two)
// is not a file of the workdir.
func TestObjectStore_IndexIsTheTruth(t *testing.T) {
	srv := natstest.Start(t)
	nc := srv.Connect()
	natstest.Provision(t, nc, bus.Settings{})
	store, index := objectStoreHandles(t, nc)
	ctx := context.Background()
	if _, err := store.PutBytes(ctx, "default/h1/orphan.txt", []byte("half written")); err != nil {
		t.Fatal(err)
	}
	w := files.NewObjectStore(store, index, "default", "h1")
	if _, err := w.Read(ctx, "/orphan.txt"); !errors.Is(err, files.ErrNotFound) {
		t.Errorf("Read of an unindexed object = %v", err)
	}
	if list, _ := w.List(ctx, "/"); len(list) != 0 {
		t.Errorf("List = %v", list)
	}
	if w := files.NewObjectStore(store, index, "default", "bad.thread"); w.Write(ctx, "/x", nil) == nil {
		t.Error("a thread id with a dot was accepted")
	}
}
