package limits

import (
	"context"
	"fmt"

	"github.com/natsagent/natsagent/internal/files"
)

// Files bounds the total size of tenant's workdir files (max_file_bytes)
// by wrapping each of its workdirs: every write is counted in one key per
// tenant ("files.<tenant>", a compare-and-set), and a write that would go
// over the quota is refused with files.ErrQuota before anything is
// stored. Removing or shrinking a file gives its bytes back. The count
// starts when the quota is configured: files stored before are not in it.
// Without a quota for the tenant the workdir is returned as is.
func (l *Limiter) Files(w files.Workdir, tenant string) files.Workdir {
	if l == nil || w == nil || l.policy.For(tenant).MaxFileBytes <= 0 {
		return w
	}
	return &quotaWorkdir{Workdir: w, l: l, tenant: tenant}
}

type quotaWorkdir struct {
	files.Workdir
	l      *Limiter
	tenant string
}

// Unwrap lets files.VersionedOf see the backend: the workdir follows the
// thread's checkpoints with a quota too (a checkout does not change the
// count).
func (q *quotaWorkdir) Unwrap() files.Workdir { return q.Workdir }

func (q *quotaWorkdir) size(ctx context.Context, p string) int64 {
	if info, err := q.Stat(ctx, p); err == nil && !info.IsDir {
		return info.Size
	}
	return 0
}

func (q *quotaWorkdir) Write(ctx context.Context, p string, data []byte) error {
	delta := int64(len(data)) - q.size(ctx, p)
	if delta > 0 {
		if err := q.l.addFileBytes(ctx, q.tenant, delta, true); err != nil {
			return err
		}
	}
	if err := q.Workdir.Write(ctx, p, data); err != nil {
		if delta > 0 {
			_ = q.l.addFileBytes(context.WithoutCancel(ctx), q.tenant, -delta, false)
		}
		return err
	}
	if delta < 0 {
		_ = q.l.addFileBytes(context.WithoutCancel(ctx), q.tenant, delta, false)
	}
	return nil
}

func (q *quotaWorkdir) Remove(ctx context.Context, p string) error {
	n := q.size(ctx, p)
	if err := q.Workdir.Remove(ctx, p); err != nil {
		return err
	}
	if n > 0 {
		_ = q.l.addFileBytes(context.WithoutCancel(ctx), q.tenant, -n, false)
	}
	return nil
}

// FileBytes is tenant's counted workdir bytes.
func (l *Limiter) FileBytes(ctx context.Context, tenant string) (int64, error) {
	n, _, err := load[int64](ctx, l, "files."+tenant)
	return n, err
}

// addFileBytes adds delta to tenant's count; with check, it refuses a
// delta that would take the count over the quota.
func (l *Limiter) addFileBytes(ctx context.Context, tenant string, delta int64, check bool) error {
	limit := l.policy.For(tenant).MaxFileBytes
	return update(ctx, l, "files."+tenant, "count the files of tenant "+tenant, func(n *int64) (bool, error) {
		if check && *n+delta > limit {
			return false, fmt.Errorf("%w: tenant %s's files hold %d bytes; %d more would pass its quota of %d bytes (limits max_file_bytes): remove files first, or ask the operator to raise the quota",
				files.ErrQuota, tenant, *n, delta, limit)
		}
		*n = max(*n+delta, 0)
		return true, nil
	})
}
