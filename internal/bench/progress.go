package bench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// progress draws one status line (on a terminal, usually stderr): the
// scenario step, a bar of its runs, and the time used of the budget. A nil
// *progress draws nothing.
type progress struct {
	w      io.Writer
	start  time.Time
	budget time.Duration

	mu         sync.Mutex
	label      string
	stageStart time.Time
	total      atomic.Int64
	done       atomic.Int64

	stop chan struct{}
	wg   sync.WaitGroup
}

func newProgress(w io.Writer, budget time.Duration) *progress {
	if w == nil {
		return nil
	}
	p := &progress{w: w, start: time.Now(), budget: budget, stop: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.draw()
			}
		}
	}()
	return p
}

// stage starts a new step of total units (0: no bar).
func (p *progress) stage(label string, total int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.label, p.stageStart = label, time.Now()
	p.mu.Unlock()
	p.total.Store(int64(total))
	p.done.Store(0)
	p.draw()
}

func (p *progress) add(n int) {
	if p != nil {
		p.done.Add(int64(n))
	}
}

func (p *progress) draw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	total, done := p.total.Load(), p.done.Load()
	var b strings.Builder
	fmt.Fprintf(&b, "\r\x1b[K%-22s", p.label)
	if total > 0 {
		const width = 24
		filled := int(min(done, total) * width / total)
		fmt.Fprintf(&b, " [%s%s] %s/%s", strings.Repeat("█", filled), strings.Repeat("░", width-filled), group(float64(done)), group(float64(total)))
	}
	fmt.Fprintf(&b, "  %.1fs  (%.0fs of %.0fs)", time.Since(p.stageStart).Seconds(), time.Since(p.start).Seconds(), p.budget.Seconds())
	_, _ = io.WriteString(p.w, b.String())
}

// close erases the line and stops drawing.
func (p *progress) close() {
	if p == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	_, _ = io.WriteString(p.w, "\r\x1b[K")
}

func (p *progress) set(n int) {
	if p != nil {
		p.done.Store(int64(n))
	}
}
