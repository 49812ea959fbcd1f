// Package files owns a thread's workdir: the files a run and its subagents
// share, the attachments a person uploads, and tool results too large for
// the transcript. Paths are virtual and absolute ("/notes/a.md"), confined
// to the workdir whatever the model asks for; backends store them in the
// JetStream Object Store (any worker can continue any run) or in a local
// directory (one node). The package knows nothing of runs or tools.
package files

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Errors callers test with errors.Is.
var (
	ErrNotFound = errors.New("no such file")
	ErrIsDir    = errors.New("is a directory")
	ErrNotDir   = errors.New("not a directory")
	ErrBadPath  = errors.New("invalid path")
	ErrTooLarge = errors.New("file too large")
	// ErrQuota: the write would take the tenant's files over its quota
	// (internal/limits).
	ErrQuota = errors.New("file quota exceeded")
)

// Info describes a file or directory of a workdir.
type Info struct {
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	IsDir   bool      `json:"is_dir,omitempty"`
	ModTime time.Time `json:"mod_time"`
	// Hash is the SHA-256 of the content (hex) where the backend keeps
	// content by hash (Versioned); empty otherwise.
	Hash string `json:"sha256,omitempty"`
}

// Workdir is a thread's files. Every path is cleaned with Clean first;
// implementations refuse anything that escapes.
type Workdir interface {
	// Read returns a file's content.
	Read(ctx context.Context, path string) ([]byte, error)
	// Write creates or replaces a file, creating its directories.
	Write(ctx context.Context, path string, data []byte) error
	// Stat describes a file or directory.
	Stat(ctx context.Context, path string) (Info, error)
	// List returns the direct children of a directory, sorted by name.
	List(ctx context.Context, dir string) ([]Info, error)
	// Walk calls fn for every file under dir (not directories), sorted by
	// path; fn returning an error stops the walk with it.
	Walk(ctx context.Context, dir string, fn func(Info) error) error
	// Remove deletes a file.
	Remove(ctx context.Context, path string) error
}

// MaxPathLen bounds a workdir path.
const MaxPathLen = 1024

// Clean turns a path the model or a person gave into the workdir's
// canonical form: absolute, slash-separated, without "." or "..", and
// confined to the workdir. A relative path is taken from the root. ".."
// that would climb above the root, NUL bytes, control characters,
// backslashes and invalid UTF-8 are refused.
func Clean(p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%w: empty path", ErrBadPath)
	}
	if len(p) > MaxPathLen {
		return "", fmt.Errorf("%w: longer than %d bytes", ErrBadPath, MaxPathLen)
	}
	if !utf8.ValidString(p) {
		return "", fmt.Errorf("%w: not valid UTF-8", ErrBadPath)
	}
	for _, r := range p {
		// C0, DEL and C1 controls, and the bidirectional formatting
		// characters that make a name display as another.
		if unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
			return "", fmt.Errorf("%w: control character in %q", ErrBadPath, p)
		}
		if r == '\\' {
			return "", fmt.Errorf("%w: use '/' to separate directories in %q", ErrBadPath, p)
		}
	}
	// Climbing above the root is refused rather than clamped: a path that
	// tries it is a mistake or an attack, and either way the caller must
	// hear about it.
	depth := 0
	for _, part := range strings.Split(p, "/") {
		switch part {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return "", fmt.Errorf("%w: %q leaves the workdir", ErrBadPath, p)
			}
		default:
			depth++
		}
	}
	return path.Clean("/" + p), nil
}

// Join cleans dir + "/" + name.
func Join(dir, name string) (string, error) { return Clean(dir + "/" + name) }
