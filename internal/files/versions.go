package files

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"
)

// A versioned workdir stores each file's content once, under the SHA-256
// of the content, and its index says which content each path has. A
// checkpoint that changed files records those changes (Change); the files
// at any checkpoint are the changes along its chain (Manifest), so a run
// forked from an earlier checkpoint, or a thread rolled back to one, gets
// the files of that checkpoint back by pointing the index at content that
// is still stored (Checkout), without copying any.

// Change is one file's change in a checkpoint: its new content, named by
// hash, or its removal (Hash empty).
type Change struct {
	Path    string    `json:"path"`
	Hash    string    `json:"sha256,omitempty"`
	Size    int64     `json:"size,omitempty"`
	ModTime time.Time `json:"mod_time,omitzero"`
}

// Removed reports whether c removes its file.
func (c Change) Removed() bool { return c.Hash == "" }

// Manifest is the files of a workdir at one point: path → Info with the
// content's hash.
type Manifest map[string]Info

// Apply applies changes in order.
func (m Manifest) Apply(changes []Change) {
	for _, c := range changes {
		if c.Removed() {
			delete(m, c.Path)
			continue
		}
		m[c.Path] = Info{Path: c.Path, Size: c.Size, ModTime: c.ModTime, Hash: c.Hash}
	}
}

// Clone copies m.
func (m Manifest) Clone() Manifest {
	out := make(Manifest, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Infos returns m's files sorted by path.
func (m Manifest) Infos() []Info {
	out := make([]Info, 0, len(m))
	for _, i := range m {
		out = append(out, i)
	}
	sortInfos(out)
	return out
}

// Diff returns the changes that take from to to, sorted by path. A file
// whose content is the same is not a change, whatever its time.
func Diff(from, to Manifest) []Change {
	var out []Change
	for p, i := range to {
		if f, ok := from[p]; !ok || f.Hash != i.Hash {
			out = append(out, Change{Path: p, Hash: i.Hash, Size: i.Size, ModTime: i.ModTime})
		}
	}
	for p := range from {
		if _, ok := to[p]; !ok {
			out = append(out, Change{Path: p})
		}
	}
	slices.SortFunc(out, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// Versioned is a workdir that keeps content by hash (the object store
// backend). The local and memory backends are one mutable tree and do not
// implement it: their files do not follow a thread's checkpoints.
type Versioned interface {
	// Snapshot returns the workdir's files with their content hashes.
	// Files stored before content was kept by hash have none and are
	// left out: they are not versioned until written again.
	Snapshot(ctx context.Context) (Manifest, error)
	// Checkout moves the workdir from the files of from to those of to:
	// each path whose file is still as from has it (the same content, or
	// absent from both) takes to's, each by a compare-and-set of its
	// index entry; a path changed since (by anyone) keeps its change. A
	// file of to whose content is not stored is not listed (never a
	// listed file without content): ErrContentMissing says which. It
	// returns how many paths it changed.
	Checkout(ctx context.Context, from, to Manifest) (int, error)
	// ReadContent returns the content stored under a hash.
	ReadContent(ctx context.Context, hash string) ([]byte, error)
}

// VersionedOf returns the versioned backend under w, looking through
// wrappers (a quota, a run's tracker) that have Unwrap() Workdir.
func VersionedOf(w Workdir) (Versioned, bool) {
	for w != nil {
		if v, ok := w.(Versioned); ok {
			return v, true
		}
		u, ok := w.(interface{ Unwrap() Workdir })
		if !ok {
			return nil, false
		}
		w = u.Unwrap()
	}
	return nil, false
}

// ContentHash is the hash a versioned workdir names content by.
func ContentHash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// validHash reports whether h is a content hash: 64 lowercase hex digits.
// A hash becomes part of an object name, so nothing else may pass.
func validHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	for _, r := range h {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return false
		}
	}
	return true
}
