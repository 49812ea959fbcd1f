package files_test

import (
	"context"
	"errors"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/natsagent/natsagent/internal/files"
)

// pathSeeds are the paths models and people send when they mean harm or
// make mistakes: climbing out, absolute host paths, NUL bytes, Windows
// separators, unicode look-alikes of '/' and '.', overlong input.
var pathSeeds = []string{
	"a.txt", "/notes/a.md", "/", ".", "", "//x//y/", "/a/./b/../c",
	"..", "../..", "/../etc/passwd", "a/../../b", "a/b/../../..", "/a/..", "/a/../..",
	"/etc/passwd", "C:\\Windows\\win.ini", "..\\..\\x", "a\x00b", "a\nb", "\x7f", "/a\tb",
	"\xff\xfe", "/caf\u00e9/\u2215etc\u2215passwd", "/\uff0e\uff0e/x", "/\u202egnp.exe", "/a\u0085b",
	"/..." + strings.Repeat("/..", 3), "/a/" + strings.Repeat("b/", 600), "/" + strings.Repeat("x", 300),
	"/out/secret.txt", "/secret", "/up/etc/passwd", "/inside/../out", "/alias.txt", "/sub/../up/x",
}

// kvKey is the key rule of nats.go's jetstream KV.
var kvKey = regexp.MustCompile(`^[-/_=\.a-zA-Z0-9]+$`)

// FuzzClean: a path Clean accepts is canonical (absolute, no "." or ".."
// element, no empty element, idempotent), holds no byte a path must not
// (NUL, control characters, backslash, invalid UTF-8), and stays inside
// any root it is joined to on the host, as an object name and as an index
// key. Everything refused is ErrBadPath.
func FuzzClean(f *testing.F) {
	for _, s := range pathSeeds {
		f.Add(s)
	}
	const root = "/srv/natsagent/files/default/h1"
	f.Fuzz(func(t *testing.T, p string) {
		c, err := files.Clean(p)
		if err != nil {
			if !errors.Is(err, files.ErrBadPath) {
				t.Fatalf("Clean(%q): %v is not ErrBadPath", p, err)
			}
			return
		}
		if !strings.HasPrefix(c, "/") || path.Clean(c) != c {
			t.Fatalf("Clean(%q) = %q is not canonical", p, c)
		}
		if again, err := files.Clean(c); err != nil || again != c {
			t.Fatalf("Clean is not idempotent: %q -> %q -> %q, %v", p, c, again, err)
		}
		if rel, err := files.Clean(strings.TrimLeft(p, "/")); strings.Trim(p, "/") != "" && (err != nil || rel != c) {
			t.Fatalf("relative %q cleans to %q, %v; absolute to %q", p, rel, err, c)
		}
		if !utf8.ValidString(c) || strings.ContainsAny(c, "\\\x00") {
			t.Fatalf("Clean(%q) = %q", p, c)
		}
		for _, r := range c {
			if unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
				t.Fatalf("Clean(%q) = %q holds a control character", p, c)
			}
		}
		if c != "/" {
			for _, el := range strings.Split(c[1:], "/") {
				if el == "" || el == "." || el == ".." {
					t.Fatalf("Clean(%q) = %q has element %q", p, c, el)
				}
			}
		}
		if host := filepath.Join(root, filepath.FromSlash(c)); host != root && !strings.HasPrefix(host, root+"/") {
			t.Fatalf("Clean(%q) = %q leaves %s as %s", p, c, root, host)
		}
		if obj := "default/h1" + c; path.Clean(obj) != strings.TrimSuffix(obj, "/") || !strings.HasPrefix(path.Clean(obj), "default/h1") {
			t.Fatalf("object name %q is not confined", obj)
		}
		if k := files.IndexKey("default", "h1", c); !kvKey.MatchString(k) || strings.Count(k, ".") != 3 {
			t.Fatalf("index key %q", k)
		}
	})
}

// FuzzLocalPaths drives the Local backend with any path, in a workdir
// holding symbolic links that lead out (to a directory, to a file, up the
// tree, to nothing) and one that stays inside. Whatever the path, nothing
// outside the thread's directory is read, created or changed: a write
// that succeeds lands inside and reads back, and the secret outside is
// never returned.
func FuzzLocalPaths(f *testing.F) {
	for _, s := range pathSeeds {
		f.Add(s, false)
		f.Add(s, true)
	}
	root := f.TempDir()
	outside := filepath.Join(root, "outside")
	if err := os.MkdirAll(outside, 0o750); err != nil {
		f.Fatal(err)
	}
	secret := filepath.Join(outside, "secret.txt")
	if err := os.WriteFile(secret, []byte("top secret"), 0o600); err != nil {
		f.Fatal(err)
	}
	w, err := files.NewLocal(filepath.Join(root, "ws"), "default", "h1")
	if err != nil {
		f.Fatal(err)
	}
	dir, _ := files.HostDir(w)
	for name, target := range map[string]string{"out": outside, "secret": secret, "up": "../../../", "dangling": "/nonexistent/x", "alias.txt": "inside.txt"} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "inside.txt"), []byte("in"), 0o600); err != nil {
		f.Fatal(err)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, p string, write bool) {
		if data, err := w.Read(ctx, p); err == nil && string(data) == "top secret" {
			t.Fatalf("Read(%q) returned the file outside the workdir", p)
		}
		if _, err := w.List(ctx, p); err != nil && !knownErr(err) {
			t.Fatalf("List(%q): unexpected error %v", p, err)
		}
		_ = w.Walk(ctx, p, func(i files.Info) error {
			if c, err := files.Clean(i.Path); err != nil || c != i.Path {
				t.Fatalf("Walk(%q) listed %q", p, i.Path)
			}
			return nil
		})
		if write {
			werr := w.Write(ctx, p, []byte("fuzz"))
			if werr == nil {
				c, _ := files.Clean(p)
				host, err := filepath.EvalSymlinks(filepath.Join(dir, filepath.FromSlash(c)))
				if err != nil || !strings.HasPrefix(host, real+string(filepath.Separator)) {
					t.Fatalf("Write(%q) landed at %q (%v), outside %s", p, host, err, real)
				}
				if data, err := w.Read(ctx, p); err != nil || string(data) != "fuzz" {
					t.Fatalf("Write(%q) does not read back: %q, %v", p, data, err)
				}
				if c != "/inside.txt" && c != "/alias.txt" {
					if err := w.Remove(ctx, p); err != nil {
						t.Fatalf("Remove(%q) after a write: %v", p, err)
					}
				}
			}
		}
		entries, err := os.ReadDir(outside)
		if err != nil || len(entries) != 1 {
			t.Fatalf("the directory outside changed after %q: %v %v", p, entries, err)
		}
		if data, err := os.ReadFile(secret); err != nil || string(data) != "top secret" {
			t.Fatalf("the secret outside changed after %q", p)
		}
	})
}

// knownErr reports the errors a workdir answers a bad or missing path
// with, as opposed to a failure of the backend itself.
func knownErr(err error) bool {
	for _, target := range []error{files.ErrBadPath, files.ErrNotFound, files.ErrNotDir, files.ErrIsDir} {
		if errors.Is(err, target) {
			return true
		}
	}
	return strings.Contains(err.Error(), "file name too long")
}
