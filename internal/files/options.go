package files

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
)

// DefaultMaxFileBytes bounds one file of a workdir when no option says
// otherwise.
const DefaultMaxFileBytes int64 = 32 << 20

// Option configures a backend.
type Option func(*options)

type options struct {
	maxFileBytes int64
}

// WithMaxFileBytes bounds the size of one file; a larger Write fails with
// ErrTooLarge. Zero or less keeps the default.
func WithMaxFileBytes(n int64) Option {
	return func(o *options) {
		if n > 0 {
			o.maxFileBytes = n
		}
	}
}

func newOptions(opts []Option) options {
	o := options{maxFileBytes: DefaultMaxFileBytes}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	return o
}

func (o options) checkSize(p string, n int) error {
	if int64(n) > o.maxFileBytes {
		return fmt.Errorf("%w: %s would hold %d bytes, over the limit of %d bytes per file", ErrTooLarge, p, n, o.maxFileBytes)
	}
	return nil
}

// HostDir returns the directory on this machine that holds w's files.
// Only local workdirs have one. execute does not use it (it works on a
// copy of any workdir); tests use it to plant what a program could leave
// in the directory.
func HostDir(w Workdir) (string, bool) {
	l, ok := w.(*Local)
	if !ok {
		return "", false
	}
	return l.dir, true
}

// Unavailable returns a workdir whose every operation fails with err: what
// a run gets when its workdir cannot be opened, so the file tools say why
// instead of the run failing.
func Unavailable(err error) Workdir { return unavailable{err} }

type unavailable struct{ err error }

func (u unavailable) Read(context.Context, string) ([]byte, error)         { return nil, u.err }
func (u unavailable) Write(context.Context, string, []byte) error          { return u.err }
func (u unavailable) Stat(context.Context, string) (Info, error)           { return Info{}, u.err }
func (u unavailable) List(context.Context, string) ([]Info, error)         { return nil, u.err }
func (u unavailable) Remove(context.Context, string) error                 { return u.err }
func (u unavailable) Walk(context.Context, string, func(Info) error) error { return u.err }

// checkScope checks a tenant or thread token: it becomes a directory name
// and part of a key, so only the protocol's id characters are allowed.
func checkScope(what, s string) error {
	if s == "" || len(s) > 128 {
		return fmt.Errorf("workdir %s %q is not a valid id", what, s)
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return fmt.Errorf("workdir %s %q is not a valid id", what, s)
		}
	}
	return nil
}

// children returns the direct children of dir among the files of a
// workdir, directories implied by deeper files, sorted by path. found is
// false when no file lives under dir.
func children(dir string, all []Info) (out []Info, found bool) {
	prefix := strings.TrimSuffix(dir, "/") + "/"
	seen := make(map[string]Info)
	for _, f := range all {
		rest, ok := strings.CutPrefix(f.Path, prefix)
		if !ok {
			continue
		}
		child, _, deeper := strings.Cut(rest, "/")
		full := prefix + child
		if deeper {
			seen[full] = Info{Path: full, IsDir: true}
		} else {
			seen[full] = f
		}
	}
	out = make([]Info, 0, len(seen))
	for _, i := range seen {
		out = append(out, i)
	}
	sortInfos(out)
	return out, len(seen) > 0
}

// under reports whether p is dir or inside it.
func under(p, dir string) bool {
	return dir == "/" || p == dir || strings.HasPrefix(p, dir+"/")
}

// ancestors lists the directories above p, nearest first, without "/".
func ancestors(p string) []string {
	var out []string
	for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
		out = append(out, d)
	}
	return out
}

func sortInfos(infos []Info) {
	slices.SortFunc(infos, func(a, b Info) int { return strings.Compare(a.Path, b.Path) })
}
