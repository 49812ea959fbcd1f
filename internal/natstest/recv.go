package natstest

import (
	"sync"
	"testing"
	"time"
)

// Patience is how long a test waits on the system under test before it
// fails: long enough for a shared CI machine under stress and -race, far
// short of go test's 30-minute timeout, which would hang the package
// with no word of what was lost.
const Patience = time.Minute

// Recv receives from ch, failing the test with what it was waiting for
// when nothing comes within Patience (or ch is closed with nothing: the
// zero value is returned then, as from a plain receive).
func Recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	return recvWithin(t, ch, Patience, what)
}

func recvWithin[T any](t testing.TB, ch <-chan T, patience time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience):
		t.Fatalf("nothing in %s: waiting for %s", patience, what)
	}
	var zero T
	return zero
}

// Wait waits for wg, failing the test with what it was waiting for when
// the group is not done within Patience. The goroutines it waited for
// are left behind: the test has failed.
func Wait(t testing.TB, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	Recv(t, done, what)
}
