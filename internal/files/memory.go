package files

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strings"
	"sync"
	"time"
)

// Memory is a Workdir held in memory: tests and single-process tools use
// it; it holds no directories of its own, they exist through their files.
type Memory struct {
	mu    sync.Mutex
	files map[string]memFile
}

type memFile struct {
	data []byte
	mod  time.Time
}

// NewMemory returns an empty in-memory workdir.
func NewMemory() *Memory { return &Memory{files: make(map[string]memFile)} }

// Read implements Workdir.
func (m *Memory) Read(ctx context.Context, p string) ([]byte, error) {
	p, err := Clean(p)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	f, ok := m.files[p]
	if !ok {
		if m.isDir(p) {
			return nil, fmt.Errorf("%s: %w", p, ErrIsDir)
		}
		return nil, fmt.Errorf("%s: %w", p, ErrNotFound)
	}
	return append([]byte(nil), f.data...), nil
}

// Write implements Workdir.
func (m *Memory) Write(ctx context.Context, p string, data []byte) error {
	p, err := Clean(p)
	if err != nil {
		return err
	}
	if p == "/" {
		return fmt.Errorf("%w: the root is a directory", ErrBadPath)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.isDir(p) {
		return fmt.Errorf("%s: %w", p, ErrIsDir)
	}
	for d := path.Dir(p); d != "/"; d = path.Dir(d) {
		if _, isFile := m.files[d]; isFile {
			return fmt.Errorf("%s: %w", d, ErrNotDir)
		}
	}
	m.files[p] = memFile{data: append([]byte(nil), data...), mod: time.Now().UTC()}
	return nil
}

// Stat implements Workdir.
func (m *Memory) Stat(ctx context.Context, p string) (Info, error) {
	p, err := Clean(p)
	if err != nil {
		return Info{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if f, ok := m.files[p]; ok {
		return Info{Path: p, Size: int64(len(f.data)), ModTime: f.mod}, nil
	}
	if m.isDir(p) {
		return Info{Path: p, IsDir: true}, nil
	}
	return Info{}, fmt.Errorf("%s: %w", p, ErrNotFound)
}

// isDir reports whether some file lives under p. The lock is held.
func (m *Memory) isDir(p string) bool {
	if p == "/" {
		return true
	}
	prefix := p + "/"
	for name := range m.files {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// List implements Workdir.
func (m *Memory) List(ctx context.Context, dir string) ([]Info, error) {
	dir, err := Clean(dir)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, isFile := m.files[dir]; isFile {
		return nil, fmt.Errorf("%s: %w", dir, ErrNotDir)
	}
	if !m.isDir(dir) {
		return nil, fmt.Errorf("%s: %w", dir, ErrNotFound)
	}
	prefix := strings.TrimSuffix(dir, "/") + "/"
	seen := make(map[string]Info)
	for name, f := range m.files {
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		child, _, deeper := strings.Cut(rest, "/")
		full := prefix + child
		if deeper {
			seen[full] = Info{Path: full, IsDir: true}
		} else {
			seen[full] = Info{Path: full, Size: int64(len(f.data)), ModTime: f.mod}
		}
	}
	out := make([]Info, 0, len(seen))
	for _, i := range seen {
		out = append(out, i)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// Walk implements Workdir.
func (m *Memory) Walk(ctx context.Context, dir string, fn func(Info) error) error {
	dir, err := Clean(dir)
	if err != nil {
		return err
	}
	m.mu.Lock()
	var infos []Info
	prefix := strings.TrimSuffix(dir, "/") + "/"
	for name, f := range m.files {
		if name == dir || strings.HasPrefix(name, prefix) {
			infos = append(infos, Info{Path: name, Size: int64(len(f.data)), ModTime: f.mod})
		}
	}
	m.mu.Unlock()
	sort.Slice(infos, func(i, j int) bool { return infos[i].Path < infos[j].Path })
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

// Remove implements Workdir.
func (m *Memory) Remove(ctx context.Context, p string) error {
	p, err := Clean(p)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.files[p]; !ok {
		if m.isDir(p) {
			return fmt.Errorf("%s: %w", p, ErrIsDir)
		}
		return fmt.Errorf("%s: %w", p, ErrNotFound)
	}
	delete(m.files, p)
	return nil
}
