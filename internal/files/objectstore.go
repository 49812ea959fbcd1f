package files

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
)

// ObjectStore keeps a thread's files in the deployment's JetStream Object
// Store, so any worker (and the gateway) sees the same workdir and any
// worker can continue any run. The object store can only list every
// object of its bucket, so each thread also keeps an index of its files in
// a KV bucket (the threads bucket): one key per file,
// "<tenant>.<thread>.file.<hash of the path>", holding the file's Info.
// The index is what exists: a write stores the object first and then its
// index entry, a remove deletes the entry first and then the object, so a
// crash in between leaves at worst an unlisted object, never a listed file
// without content.
//
// Content is stored once per thread under its SHA-256,
// "<tenant>/<thread>//sha256/<hex>" (a cleaned path never starts with
// "/", so no file's name can be one), and the index entry names the hash:
// checkpoints record which content each path had (Versioned), and two
// paths or two checkpoints with the same content share one object. A
// remove or an overwrite deletes only the index entry; the content stays
// for the checkpoints that name it until a sweep collects what nothing
// names (Collect). Files written before content was kept by hash are
// read from their path object, and that object goes when they are
// written again or removed.
type ObjectStore struct {
	store          jetstream.ObjectStore
	index          jetstream.KeyValue
	tenant, thread string
	opts           options
}

// NewObjectStore returns the workdir of one thread. store is the files
// bucket (bus.Names.FilesBucket), index the threads bucket
// (bus.Names.ThreadsBucket). Content objects are named
// "<tenant>/<thread>//sha256/<hex>" (ContentObject).
func NewObjectStore(store jetstream.ObjectStore, index jetstream.KeyValue, tenant, thread string, opts ...Option) Workdir {
	if err := checkScope("tenant", tenant); err != nil {
		return Unavailable(err)
	}
	if err := checkScope("thread", thread); err != nil {
		return Unavailable(err)
	}
	return &ObjectStore{store: store, index: index, tenant: tenant, thread: thread, opts: newOptions(opts)}
}

// IndexKey is the index key of a file of a thread. The path is hashed so
// any path fits a key; 128 bits make a collision a non-event.
func IndexKey(tenant, thread, p string) string {
	sum := sha256.Sum256([]byte(p))
	return tenant + "." + thread + ".file." + hex.EncodeToString(sum[:16])
}

func (o *ObjectStore) object(p string) string { return o.tenant + "/" + o.thread + p }
func (o *ObjectStore) key(p string) string    { return IndexKey(o.tenant, o.thread, p) }

// content is the object that holds content by its hash.
func (o *ObjectStore) content(hash string) string {
	return ContentObject(o.tenant, o.thread, hash)
}

// ContentObject is the name of the object holding a thread's content by
// hash.
func ContentObject(tenant, thread, hash string) string {
	return tenant + "/" + thread + "//sha256/" + hash
}

// opTimeout bounds one request to the object store or its index (a whole
// file's transfer, or the index scan). A run's context has the run's
// deadline, an hour by default: without a bound, a request lost with a
// NATS node that went down would hold the tool, and the run, that long.
// A minute moves the largest file (max_file_bytes) many times over.
var opTimeout = time.Minute

// entry reads the index entry of a file; ok is false when there is none.
func (o *ObjectStore) entry(ctx context.Context, p string) (Info, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	e, err := o.index.Get(ctx, o.key(p))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Info{}, false, nil
	}
	if err != nil {
		return Info{}, false, fmt.Errorf("read the file index of %s: %w", p, err)
	}
	var i Info
	if err := json.Unmarshal(e.Value(), &i); err != nil || i.Path != p {
		// A foreign or corrupt value under a file key is not this file.
		return Info{}, false, nil
	}
	return i, true, nil
}

// scan reads the thread's whole index. Only this thread's keys are read.
func (o *ObjectStore) scan(ctx context.Context) ([]Info, error) {
	var out []Info
	if err := o.readIndex(ctx, func(_ jetstream.KeyValueEntry, i Info) { out = append(out, i) }); err != nil {
		return nil, err
	}
	sortInfos(out)
	return out, nil
}

// readIndex calls fn with every entry of the thread's file index (only
// this thread's keys are read) whose value decodes to a file with a path.
func (o *ObjectStore) readIndex(ctx context.Context, fn func(jetstream.KeyValueEntry, Info)) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	w, err := o.index.Watch(ctx, o.tenant+"."+o.thread+".file.*", jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("read the file index: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("read the file index: the watch ended early")
			}
			if e == nil {
				return nil
			}
			var i Info
			if json.Unmarshal(e.Value(), &i) == nil && i.Path != "" {
				fn(e, i)
			}
		}
	}
}

// missing explains why p has no index entry: a directory or nothing.
func (o *ObjectStore) missing(ctx context.Context, p string) error {
	all, err := o.scan(ctx)
	if err != nil {
		return err
	}
	if _, found := children(p, all); found || p == "/" {
		return fmt.Errorf("%s: %w", p, ErrIsDir)
	}
	return fmt.Errorf("%s: %w", p, ErrNotFound)
}

// Read implements Workdir.
func (o *ObjectStore) Read(ctx context.Context, p string) ([]byte, error) {
	p, err := Clean(p)
	if err != nil {
		return nil, err
	}
	i, ok, err := o.entry(ctx, p)
	if err != nil {
		return nil, err
	} else if !ok {
		return nil, o.missing(ctx, p)
	}
	name := o.object(p)
	if i.Hash != "" {
		if !validHash(i.Hash) {
			return nil, fmt.Errorf("%s: %w", p, ErrNotFound)
		}
		name = o.content(i.Hash)
	}
	getCtx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	data, err := o.store.GetBytes(getCtx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		// Removed between the index read and now.
		return nil, fmt.Errorf("%s: %w", p, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return data, nil
}

// Write implements Workdir.
func (o *ObjectStore) Write(ctx context.Context, p string, data []byte) error {
	p, err := Clean(p)
	if err != nil {
		return err
	}
	if p == "/" {
		return fmt.Errorf("%w: the root is a directory", ErrBadPath)
	}
	if err := o.opts.checkSize(p, len(data)); err != nil {
		return err
	}
	all, err := o.scan(ctx)
	if err != nil {
		return err
	}
	if _, isDir := children(p, all); isDir {
		return fmt.Errorf("%s: %w", p, ErrIsDir)
	}
	var old *Info
	for _, f := range all {
		for _, d := range ancestors(p) {
			if f.Path == d {
				return fmt.Errorf("%s: %w", d, ErrNotDir)
			}
		}
		if f.Path == p {
			old = &f
		}
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	hash := ContentHash(data)
	if err := o.putContent(ctx, hash, data); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	entry, _ := json.Marshal(Info{Path: p, Size: int64(len(data)), ModTime: time.Now().UTC(), Hash: hash})
	if _, err := o.index.Put(ctx, o.key(p), entry); err != nil {
		return fmt.Errorf("index %s: %w", p, bus.MarkStoreFull(o.index.Bucket(), err))
	}
	if old != nil && old.Hash == "" {
		// Its content was stored under its path before content was kept
		// by hash; nothing else names that object.
		_ = o.store.Delete(ctx, o.object(p))
	}
	return nil
}

// putContent stores content under its hash. Content already stored is
// stored again (as every write stored its file before): that makes it
// new to a collection that listed it as unnamed (Collect), which then
// leaves it alone.
func (o *ObjectStore) putContent(ctx context.Context, hash string, data []byte) error {
	_, err := o.store.PutBytes(ctx, o.content(hash), data)
	return err
}

// Stat implements Workdir.
func (o *ObjectStore) Stat(ctx context.Context, p string) (Info, error) {
	p, err := Clean(p)
	if err != nil {
		return Info{}, err
	}
	if p == "/" {
		return Info{Path: "/", IsDir: true}, nil
	}
	i, ok, err := o.entry(ctx, p)
	if err != nil {
		return Info{}, err
	}
	if ok {
		return i, nil
	}
	if err := o.missing(ctx, p); errors.Is(err, ErrIsDir) {
		return Info{Path: p, IsDir: true}, nil
	} else {
		return Info{}, err
	}
}

// List implements Workdir.
func (o *ObjectStore) List(ctx context.Context, dir string) ([]Info, error) {
	dir, err := Clean(dir)
	if err != nil {
		return nil, err
	}
	all, err := o.scan(ctx)
	if err != nil {
		return nil, err
	}
	for _, f := range all {
		if f.Path == dir {
			return nil, fmt.Errorf("%s: %w", dir, ErrNotDir)
		}
	}
	out, found := children(dir, all)
	if !found && dir != "/" {
		return nil, fmt.Errorf("%s: %w", dir, ErrNotFound)
	}
	return out, nil
}

// Walk implements Workdir.
func (o *ObjectStore) Walk(ctx context.Context, dir string, fn func(Info) error) error {
	dir, err := Clean(dir)
	if err != nil {
		return err
	}
	all, err := o.scan(ctx)
	if err != nil {
		return err
	}
	for _, f := range all {
		if !under(f.Path, dir) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

// Remove implements Workdir.
func (o *ObjectStore) Remove(ctx context.Context, p string) error {
	p, err := Clean(p)
	if err != nil {
		return err
	}
	i, ok, err := o.entry(ctx, p)
	if err != nil {
		return err
	} else if !ok {
		return o.missing(ctx, p)
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := o.index.Delete(ctx, o.key(p)); err != nil {
		return fmt.Errorf("remove %s from the index: %w", p, err)
	}
	if i.Hash != "" {
		// The content may be named by a checkpoint or another path.
		return nil
	}
	if err := o.store.Delete(ctx, o.object(p)); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}
