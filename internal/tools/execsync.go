package tools

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/natsagent/natsagent/internal/files"
)

// A command of execute works on a copy of the thread's workdir, whatever
// its backend: materialize copies the workdir into a directory of this
// machine before the command, syncBack writes what the command changed
// back through the files layer after it, so other workers, subagents and
// the HTTP file API see it. The sandbox never sees the backend's own
// storage, and nothing the command leaves in its directory (a symbolic
// link, a FIFO, a name the files layer refuses) is followed or kept.

// syncLimits bound the copy.
type syncLimits struct {
	maxFile  int64 // one file (files.max_file_bytes)
	maxTotal int64 // the whole copy, in and out (files.sandbox.max_workdir_bytes)
}

// manifest is what materialize copied: each file's path and content hash.
type manifest map[string][sha256.Size]byte

// errWorkdirTooLarge is returned when the workdir is over the copy's cap.
var errWorkdirTooLarge = errors.New("workdir too large for execute")

// materialize copies every file of w into dir.
func materialize(ctx context.Context, w files.Workdir, dir string, lim syncLimits) (manifest, error) {
	var infos []files.Info
	var total int64
	err := w.Walk(ctx, "/", func(i files.Info) error {
		total += i.Size
		infos = append(infos, i)
		return nil
	})
	if err != nil && !errors.Is(err, files.ErrNotFound) {
		return nil, fmt.Errorf("list the workdir: %w", err)
	}
	if total > lim.maxTotal {
		return nil, fmt.Errorf("%w: its files hold %d bytes, over the %d bytes execute copies into its sandbox (files.sandbox.max_workdir_bytes); "+
			"remove files the command does not need, or ask the operator to raise the limit", errWorkdirTooLarge, total, lim.maxTotal)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	m := make(manifest, len(infos))
	for _, i := range infos {
		p, err := files.Clean(i.Path)
		if err != nil || p == "/" {
			continue // not a file the files layer would name
		}
		data, err := w.Read(ctx, p)
		if errors.Is(err, files.ErrNotFound) {
			continue // removed since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("copy %s into the sandbox: %w", p, err)
		}
		rel := strings.TrimPrefix(p, "/")
		if d := path.Dir(rel); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return nil, fmt.Errorf("copy %s into the sandbox: %w", p, err)
			}
		}
		if err := root.WriteFile(rel, data, 0o644); err != nil {
			return nil, fmt.Errorf("copy %s into the sandbox: %w", p, err)
		}
		m[p] = sha256.Sum256(data)
	}
	return m, nil
}

// syncReport says what syncBack did, for the model.
type syncReport struct {
	written, removed []string
	skipped          []string // "path (why)"
}

func (r syncReport) String() string {
	var b strings.Builder
	list := func(what string, items []string) {
		if len(items) == 0 {
			return
		}
		const show = 20
		fmt.Fprintf(&b, "\n%s: %s", what, strings.Join(items[:min(len(items), show)], ", "))
		if len(items) > show {
			fmt.Fprintf(&b, " and %d more", len(items)-show)
		}
	}
	list("Files written to the workdir", r.written)
	list("Files removed from the workdir", r.removed)
	list("Not kept", r.skipped)
	return b.String()
}

// syncBack writes the files of dir that differ from m to w, and removes
// from w the files of m that dir no longer holds. Only regular files are
// read, never through a symbolic link; every name is checked with
// files.Clean, every size against the limits.
func syncBack(ctx context.Context, w files.Workdir, dir string, m manifest, lim syncLimits) (syncReport, error) {
	var rep syncReport
	root, err := os.OpenRoot(dir)
	if err != nil {
		return rep, err
	}
	defer root.Close()
	// Only the names are kept while walking; each file is read again when
	// it is written, so memory holds one file at a time (the command's
	// processes are gone: nothing changes in between).
	type change struct{ path, rel string }
	var writes []change
	seen := make(map[string]bool) // paths of m still there, changed or not
	var total int64
	err = filepath.WalkDir(dir, func(host string, d fs.DirEntry, err error) error {
		if err != nil {
			if host == dir {
				return err
			}
			return nil // an unreadable directory: what it holds stays as it was
		}
		if host == dir {
			return nil
		}
		rel, err := filepath.Rel(dir, host)
		if err != nil {
			return err
		}
		p, err := files.Clean("/" + filepath.ToSlash(rel))
		if err != nil {
			rep.skipped = append(rep.skipped, fmt.Sprintf("%q (%v)", "/"+filepath.ToSlash(rel), err))
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		switch t := d.Type(); {
		case t.IsDir():
			return nil
		case t&fs.ModeSymlink != 0:
			rep.skipped = append(rep.skipped, p+" (symbolic link)")
			return nil
		case !t.IsRegular():
			rep.skipped = append(rep.skipped, p+" (not a regular file)")
			return nil
		}
		data, err := readRegular(root, filepath.ToSlash(rel), lim.maxFile)
		if err != nil {
			if _, had := m[p]; had {
				seen[p] = true // unreadable: leave the workdir's copy alone
			}
			rep.skipped = append(rep.skipped, fmt.Sprintf("%s (%v)", p, err))
			return nil
		}
		if sum, had := m[p]; had {
			seen[p] = true
			if sum == sha256.Sum256(data) {
				return nil
			}
		}
		if total += int64(len(data)); total > lim.maxTotal {
			rep.skipped = append(rep.skipped, fmt.Sprintf("%s (the files written exceed %d bytes, files.sandbox.max_workdir_bytes)", p, lim.maxTotal))
			total -= int64(len(data))
			return nil
		}
		writes = append(writes, change{p, filepath.ToSlash(rel)})
		return nil
	})
	if err != nil {
		return rep, fmt.Errorf("read the command's directory: %w", err)
	}
	// Removals first: a file that became a directory must be gone before
	// the files under it are written.
	var gone []string
	for p := range m {
		if !seen[p] {
			gone = append(gone, p)
		}
	}
	slices.Sort(gone)
	for _, p := range gone {
		if err := w.Remove(ctx, p); err != nil && !errors.Is(err, files.ErrNotFound) {
			rep.skipped = append(rep.skipped, fmt.Sprintf("%s (not removed: %v)", p, err))
			continue
		}
		rep.removed = append(rep.removed, p)
	}
	for _, c := range writes {
		data, err := readRegular(root, c.rel, lim.maxFile)
		if err != nil {
			rep.skipped = append(rep.skipped, fmt.Sprintf("%s (%v)", c.path, err))
			continue
		}
		if err := w.Write(ctx, c.path, data); err != nil {
			if ctx.Err() != nil {
				return rep, err
			}
			rep.skipped = append(rep.skipped, fmt.Sprintf("%s (%v)", c.path, err))
			continue
		}
		rep.written = append(rep.written, c.path)
	}
	return rep, nil
}

// readRegular reads a regular file of root, refusing a symbolic link in
// its last component (os.Root refuses one that leaves root anywhere) and
// anything over max bytes. O_NONBLOCK keeps a FIFO from blocking the read.
func readRegular(root *os.Root, name string, max int64) ([]byte, error) {
	f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("cannot read it: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	if fi.Size() > max {
		return nil, fmt.Errorf("%d bytes, over the limit of %d bytes per file", fi.Size(), max)
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("over the limit of %d bytes per file", max)
	}
	return data, nil
}
