package files

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/bus"
)

// ErrContentMissing: a checkout did not list a file because the content
// its checkpoint names is not stored (collected, or never stored).
var ErrContentMissing = errors.New("file content not stored")

// indexed is an index entry with its revision.
type indexed struct {
	Info
	rev uint64
}

// entries reads the thread's index with each entry's revision.
func (o *ObjectStore) entries(ctx context.Context) (map[string]indexed, error) {
	out := map[string]indexed{}
	err := o.readIndex(ctx, func(e jetstream.KeyValueEntry, i Info) {
		if e.Key() == o.key(i.Path) {
			out[i.Path] = indexed{Info: i, rev: e.Revision()}
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Snapshot implements Versioned.
func (o *ObjectStore) Snapshot(ctx context.Context) (Manifest, error) {
	all, err := o.entries(ctx)
	if err != nil {
		return nil, err
	}
	m := make(Manifest, len(all))
	for p, e := range all {
		if validHash(e.Hash) {
			m[p] = e.Info
		}
	}
	return m, nil
}

// ReadContent implements Versioned.
func (o *ObjectStore) ReadContent(ctx context.Context, hash string) ([]byte, error) {
	if !validHash(hash) {
		return nil, fmt.Errorf("%w: %q is not a content hash", ErrNotFound, hash)
	}
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	data, err := o.store.GetBytes(ctx, o.content(hash))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("content %s: %w", hash, ErrContentMissing)
	}
	return data, err
}

// stored reports whether the content of hash is in the store.
func (o *ObjectStore) stored(ctx context.Context, hash string) (bool, error) {
	info, err := o.store.GetInfo(ctx, o.content(hash))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return !info.Deleted, nil
}

// Checkout implements Versioned.
func (o *ObjectStore) Checkout(ctx context.Context, from, to Manifest) (int, error) {
	live, err := o.entries(ctx)
	if err != nil {
		return 0, err
	}
	paths := make([]string, 0, len(from)+len(to))
	for p := range from {
		paths = append(paths, p)
	}
	for p := range to {
		if _, ok := from[p]; !ok {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	changed := 0
	var missing []string
	for _, p := range paths {
		f, inFrom := from[p]
		t, inTo := to[p]
		if inFrom == inTo && (!inFrom || f.Hash == t.Hash) {
			continue
		}
		l, inLive := live[p]
		if inLive != inFrom || (inLive && l.Hash != f.Hash) {
			continue // changed since from: the change stays
		}
		if c, err := Clean(p); err != nil || c != p || p == "/" {
			continue // not a path a write would have stored
		}
		key := o.key(p)
		if !inTo {
			err = o.index.Delete(ctx, key, jetstream.LastRevision(l.rev))
		} else {
			ok := validHash(t.Hash)
			if ok {
				if ok, err = o.stored(ctx, t.Hash); err != nil {
					return changed, fmt.Errorf("check the content of %s: %w", p, err)
				}
			}
			if !ok {
				missing = append(missing, p)
				continue
			}
			entry, _ := json.Marshal(Info{Path: p, Size: t.Size, ModTime: t.ModTime, Hash: t.Hash})
			if inLive {
				_, err = o.index.Update(ctx, key, entry, l.rev)
			} else {
				_, err = o.index.Create(ctx, key, entry)
			}
		}
		if casRefused(err) {
			continue // written meanwhile: that write stands
		}
		if err != nil {
			return changed, fmt.Errorf("check out %s: %w", p, bus.MarkStoreFull(o.index.Bucket(), err))
		}
		changed++
	}
	if len(missing) > 0 {
		return changed, fmt.Errorf("%w: %s", ErrContentMissing, strings.Join(missing, ", "))
	}
	return changed, nil
}

// casRefused reports a compare-and-set the server refused because the key
// changed: 10071, 10164 on a replicated stream, or a create of a key that
// exists.
func casRefused(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) ||
		(errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == 10164))
}

// Collect deletes the content objects of tenant's threads in the files
// bucket that nothing names any more and that were stored before cutoff:
// keep(thread, hash) says whether a thread's index or one of its
// checkpoints names a hash. The caller builds keep from threads no run
// holds. cutoff leaves alone the content a write stored but has not
// indexed yet: it must be older than the longest write (opTimeout) with
// a wide margin. Each deletion is a compare-and-set of the object's meta
// record at the revision listed, so content stored again after the
// listing (a write of the same bytes) is never deleted. It returns how
// many objects it deleted.
func Collect(ctx context.Context, js jetstream.JetStream, bucket, tenant string, keep func(thread, hash string) bool, cutoff time.Time) (int, error) {
	if checkScope("tenant", tenant) != nil {
		return 0, fmt.Errorf("collect: tenant %q is not a valid id", tenant)
	}
	store, err := js.ObjectStore(ctx, bucket)
	if err != nil {
		return 0, fmt.Errorf("open the object store %s: %w", bucket, err)
	}
	stream, err := js.Stream(ctx, "OBJ_"+bucket)
	if err != nil {
		return 0, fmt.Errorf("open the stream of %s: %w", bucket, err)
	}
	infos, err := store.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("list the object store: %w", err)
	}
	deleted := 0
	for _, info := range infos {
		rest, ok := strings.CutPrefix(info.Name, tenant+"/")
		if !ok {
			continue
		}
		thread, hash, ok := strings.Cut(rest, "//sha256/")
		if !ok || checkScope("thread", thread) != nil || !validHash(hash) {
			continue
		}
		if info.Deleted || !info.ModTime.Before(cutoff) || keep(thread, hash) {
			continue
		}
		ok, err := deleteIfUnchanged(ctx, js, stream, bucket, info.Name, cutoff)
		if err != nil {
			return deleted, err
		}
		if ok {
			deleted++
		}
	}
	return deleted, nil
}

// deleteIfUnchanged deletes an object as nats.go's Delete does (a deleted
// meta record, then a purge of its chunks), but only if its meta record
// is still the one stored before cutoff.
func deleteIfUnchanged(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, bucket, name string, cutoff time.Time) (bool, error) {
	subject := "$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(name))
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	m, err := stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the meta record of %s: %w", name, err)
	}
	var info jetstream.ObjectInfo
	if json.Unmarshal(m.Data, &info) != nil || info.Deleted || info.NUID == "" || !m.Time.Before(cutoff) {
		return false, nil
	}
	info.Deleted, info.Size, info.Chunks, info.Digest, info.ModTime = true, 0, 0, "", time.Time{}
	data, err := json.Marshal(info)
	if err != nil {
		return false, err
	}
	mm := nats.NewMsg(subject)
	mm.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	mm.Data = data
	if _, err := js.PublishMsg(ctx, mm, jetstream.WithExpectLastSequencePerSubject(m.Sequence)); casRefused(err) {
		return false, nil // stored again since it was listed
	} else if err != nil {
		return false, fmt.Errorf("delete %s: %w", name, err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject("$O."+bucket+".C."+info.NUID)); err != nil {
		return true, fmt.Errorf("purge the chunks of %s: %w", name, err)
	}
	return true, nil
}
