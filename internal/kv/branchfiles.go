package kv

import (
	"context"
	"errors"
	"fmt"

	"github.com/natsagent/natsagent/internal/files"
)

// FilesAtEach returns the files at each checkpoint of ids. Those on chain
// (a thread's chain, oldest first, as Load returns it) are computed from
// it; any other is read with the thread's deltas, once. A checkpoint
// whose chain is not all there has a nil manifest.
func (s *Checkpoints) FilesAtEach(ctx context.Context, tenant, thread string, chain []*Delta, ids ...string) ([]files.Manifest, error) {
	out := make([]files.Manifest, len(ids))
	var byID map[string]*Delta
	for i, id := range ids {
		if id == "" {
			out[i] = files.Manifest{}
			continue
		}
		if at := onChain(chain, id); at >= 0 {
			out[i] = FilesOf(chain[:at+1])
			continue
		}
		if byID == nil {
			var err error
			if byID, err = s.All(ctx, tenant, thread); err != nil {
				return nil, err
			}
			for _, d := range chain {
				byID[d.ID] = d
			}
		}
		out[i], _ = FilesAt(byID, id)
	}
	return out, nil
}

func onChain(chain []*Delta, id string) int {
	for i, d := range chain {
		if d.ID == id {
			return i
		}
	}
	return -1
}

// CheckoutFiles makes a thread's versioned workdir show the files of
// checkpoint to, given that it shows those of checkpoint from: see
// files.Versioned.Checkout (a path changed since from keeps its change).
// When from's files cannot be known, the workdir as it is stands for
// them, so every path takes to's. chain is the chain of to (or of a
// checkpoint after it), oldest first. A file whose content is not stored
// is left out and reported as files.ErrContentMissing.
func (s *Checkpoints) CheckoutFiles(ctx context.Context, v files.Versioned, tenant, thread string, chain []*Delta, from, to string) (int, error) {
	ms, err := s.FilesAtEach(ctx, tenant, thread, chain, from, to)
	if err != nil {
		return 0, err
	}
	fromFiles, toFiles := ms[0], ms[1]
	if toFiles == nil {
		return 0, fmt.Errorf("thread %s: the files of checkpoint %s are not known (a delta of its chain is missing)", thread, to)
	}
	if fromFiles == nil {
		if fromFiles, err = v.Snapshot(ctx); err != nil {
			return 0, err
		}
	}
	if len(files.Diff(fromFiles, toFiles)) == 0 {
		return 0, nil
	}
	return v.Checkout(ctx, fromFiles, toFiles)
}

// ContentMissing reports a checkout that left files out because their
// content is gone: logged, not retried.
func ContentMissing(err error) bool { return errors.Is(err, files.ErrContentMissing) }
