package files

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// Local keeps a thread's files in a directory of this machine,
// <root>/<tenant>/<thread>: one node only, but programs (execute) can work
// on the files. Symbolic links that lead out of the thread's directory are
// refused, never followed: every path is checked with filepath.EvalSymlinks
// for a clear error, and every operation goes through an os.Root, which
// refuses an escaping link even when it appears between the check and the
// operation.
type Local struct {
	dir  string // the thread's directory as given
	real string // dir with its symbolic links resolved
	opts options
}

// tmpPrefix names the temporary files of atomic writes; listings skip them.
const tmpPrefix = ".natsagent-tmp-"

// NewLocal returns the workdir of one thread under root, creating its
// directory.
func NewLocal(root, tenant, thread string, opts ...Option) (Workdir, error) {
	if err := checkScope("tenant", tenant); err != nil {
		return nil, err
	}
	if err := checkScope("thread", thread); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("files: local directory %q: %w", root, err)
	}
	dir := filepath.Join(abs, tenant, thread)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("files: create the workdir %s: %w", dir, err)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("files: resolve the workdir %s: %w", dir, err)
	}
	return &Local{dir: dir, real: real, opts: newOptions(opts)}, nil
}

// resolve cleans p and returns it with its name relative to the thread's
// directory ("." for the root), after checking that no symbolic link on
// the way leads out.
func (l *Local) resolve(p string) (string, string, error) {
	p, err := Clean(p)
	if err != nil {
		return "", "", err
	}
	rel := "."
	if p != "/" {
		rel = strings.TrimPrefix(p, "/")
	}
	if err := l.confine(p, rel); err != nil {
		return "", "", err
	}
	return p, rel, nil
}

// confine resolves the deepest existing part of rel and refuses it when it
// lies outside the thread's directory.
func (l *Local) confine(p, rel string) error {
	host := filepath.Join(l.dir, filepath.FromSlash(rel))
	for {
		if _, err := os.Lstat(host); err == nil {
			break
		}
		parent := filepath.Dir(host)
		if parent == host || len(parent) < len(l.dir) {
			return nil
		}
		host = parent
	}
	real, err := filepath.EvalSymlinks(host)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %s is a symbolic link to nothing inside the workdir", ErrBadPath, p)
		}
		return fmt.Errorf("resolve %s: %w", p, err)
	}
	if real != l.real && !strings.HasPrefix(real, l.real+string(filepath.Separator)) {
		return fmt.Errorf("%w: %s leaves the workdir through a symbolic link", ErrBadPath, p)
	}
	return nil
}

func (l *Local) open() (*os.Root, error) {
	r, err := os.OpenRoot(l.dir)
	if err != nil {
		return nil, fmt.Errorf("open the workdir: %w", err)
	}
	return r, nil
}

// fail maps an operating system error to the package's errors.
func (l *Local) fail(p string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%s: %w", p, ErrNotFound)
	case errors.Is(err, syscall.EISDIR):
		return fmt.Errorf("%s: %w", p, ErrIsDir)
	case errors.Is(err, syscall.ENAMETOOLONG):
		return fmt.Errorf("%w: a name in %s is longer than this file system allows (255 bytes)", ErrBadPath, p)
	case strings.Contains(err.Error(), "escapes"):
		return fmt.Errorf("%w: %s leaves the workdir through a symbolic link", ErrBadPath, p)
	}
	return fmt.Errorf("%s: %w", p, err)
}

// Read implements Workdir.
func (l *Local) Read(ctx context.Context, p string) ([]byte, error) {
	p, rel, err := l.resolve(p)
	if err != nil {
		return nil, err
	}
	r, err := l.open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	fi, err := r.Stat(rel)
	if err != nil {
		return nil, l.fail(p, err)
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("%s: %w", p, ErrIsDir)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w", p, ErrNotFound)
	}
	data, err := r.ReadFile(rel)
	return data, l.fail(p, err)
}

// Write implements Workdir. The file is replaced atomically: readers see
// the old or the new content, never a part.
func (l *Local) Write(ctx context.Context, p string, data []byte) error {
	p, rel, err := l.resolve(p)
	if err != nil {
		return err
	}
	if p == "/" {
		return fmt.Errorf("%w: the root is a directory", ErrBadPath)
	}
	if err := l.opts.checkSize(p, len(data)); err != nil {
		return err
	}
	r, err := l.open()
	if err != nil {
		return err
	}
	defer r.Close()
	if fi, err := r.Stat(rel); err == nil && fi.IsDir() {
		return fmt.Errorf("%s: %w", p, ErrIsDir)
	}
	parent := path.Dir(rel)
	for _, d := range ancestors(p) {
		if fi, err := r.Stat(strings.TrimPrefix(d, "/")); err == nil && !fi.IsDir() {
			return fmt.Errorf("%s: %w", d, ErrNotDir)
		}
	}
	if err := r.MkdirAll(parent, 0o750); err != nil {
		return l.fail(p, err)
	}
	tmp := path.Join(parent, tmpPrefix+rand.Text())
	f, err := r.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return l.fail(p, err)
	}
	_, werr := f.Write(data)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = r.Rename(tmp, rel)
	}
	if werr != nil {
		_ = r.Remove(tmp)
		return l.fail(p, werr)
	}
	return nil
}

// Stat implements Workdir.
func (l *Local) Stat(ctx context.Context, p string) (Info, error) {
	p, rel, err := l.resolve(p)
	if err != nil {
		return Info{}, err
	}
	r, err := l.open()
	if err != nil {
		return Info{}, err
	}
	defer r.Close()
	fi, err := r.Stat(rel)
	if err != nil {
		return Info{}, l.fail(p, err)
	}
	return infoOf(p, fi)
}

func infoOf(p string, fi fs.FileInfo) (Info, error) {
	switch {
	case fi.IsDir():
		return Info{Path: p, IsDir: true, ModTime: fi.ModTime().UTC()}, nil
	case fi.Mode().IsRegular():
		return Info{Path: p, Size: fi.Size(), ModTime: fi.ModTime().UTC()}, nil
	}
	// Sockets, devices and pipes are not files a workdir holds.
	return Info{}, fmt.Errorf("%s: %w", p, ErrNotFound)
}

// List implements Workdir.
func (l *Local) List(ctx context.Context, dir string) ([]Info, error) {
	dir, rel, err := l.resolve(dir)
	if err != nil {
		return nil, err
	}
	r, err := l.open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	fi, err := r.Stat(rel)
	if err != nil {
		return nil, l.fail(dir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s: %w", dir, ErrNotDir)
	}
	entries, err := fs.ReadDir(r.FS(), rel)
	if err != nil {
		return nil, l.fail(dir, err)
	}
	out := make([]Info, 0, len(entries))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			continue
		}
		full := path.Join(dir, e.Name())
		// Stat through the root follows links that stay inside and
		// refuses the others, which are left out.
		fi, err := r.Stat(path.Join(rel, e.Name()))
		if err != nil {
			continue
		}
		if i, err := infoOf(full, fi); err == nil {
			out = append(out, i)
		}
	}
	sortInfos(out)
	return out, nil
}

// Walk implements Workdir. Links to directories are not followed, so a
// link cannot make the walk loop; links to files inside are listed.
func (l *Local) Walk(ctx context.Context, dir string, fn func(Info) error) error {
	dir, rel, err := l.resolve(dir)
	if err != nil {
		return err
	}
	r, err := l.open()
	if err != nil {
		return err
	}
	defer r.Close()
	var infos []Info
	err = fs.WalkDir(r.FS(), rel, func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			if name == rel && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)) {
				return fs.SkipAll
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() || strings.HasPrefix(d.Name(), tmpPrefix) {
			return nil
		}
		fi, err := r.Stat(name)
		if err != nil || !fi.Mode().IsRegular() {
			return nil
		}
		infos = append(infos, Info{Path: "/" + name, Size: fi.Size(), ModTime: fi.ModTime().UTC()})
		return nil
	})
	if err != nil {
		return l.fail(dir, err)
	}
	sortInfos(infos)
	for _, i := range infos {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(i); err != nil {
			return err
		}
	}
	return nil
}

// Remove implements Workdir. Directories left empty are removed too:
// directories exist through their files, as in the other backends.
func (l *Local) Remove(ctx context.Context, p string) error {
	p, rel, err := l.resolve(p)
	if err != nil {
		return err
	}
	r, err := l.open()
	if err != nil {
		return err
	}
	defer r.Close()
	fi, err := r.Lstat(rel)
	if err != nil {
		return l.fail(p, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("%s: %w", p, ErrIsDir)
	}
	if err := r.Remove(rel); err != nil {
		return l.fail(p, err)
	}
	for d := path.Dir(rel); d != "." && d != "/"; d = path.Dir(d) {
		if r.Remove(d) != nil {
			break
		}
	}
	return nil
}
