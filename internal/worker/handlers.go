package worker

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// handlerIdle is how long a request's goroutine waits for the next
// request before it ends.
const handlerIdle = 30 * time.Second

// testHookHandling, when set, is called on the goroutine that handles a
// delivered request (handle), first.
var testHookHandling func()

// testHookIdle, when set, is called by a goroutine that finished a
// request, just before it waits for the next.
var testHookIdle func()

// dispatch hands a delivered request to a goroutine that finished its
// last one and waits for the next, or to a new one when none waits.
//
// A new goroutine starts with a small stack, and a run's call depth (the
// request's JSON decode, the middleware chain's nested wrappers, the
// records' encoders) grows it in several copies: ≈ 17 µs per run in an
// idle run's CPU profile, spent on the run's own path, so added to its
// latency. A kept goroutine has it grown already (the garbage collector
// shrinks an idle one's by half at most per cycle).
//
// Only the pull loop sends on w.next, and until stop is closed: next is
// unbuffered, so a send succeeds only when a goroutine waits for it.
func (w *Worker) dispatch(base context.Context, msg jetstream.Msg, stop <-chan struct{}) {
	select {
	case w.next <- msg:
		return
	default:
	}
	w.wg.Add(1)
	go w.serve(base, msg, stop)
}

// serve handles msg, then each request dispatch hands it, until none came
// for handlerIdle or the pull loop ended (stop).
func (w *Worker) serve(base context.Context, msg jetstream.Msg, stop <-chan struct{}) {
	defer w.wg.Done()
	var idle *time.Timer
	for {
		w.handle(base, msg)
		if idle == nil {
			idle = time.NewTimer(handlerIdle)
			defer idle.Stop()
		} else {
			idle.Reset(handlerIdle)
		}
		if testHookIdle != nil {
			testHookIdle()
		}
		select {
		case msg = <-w.next:
		case <-idle.C:
			return
		case <-stop:
			return
		}
	}
}
