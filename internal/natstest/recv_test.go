package natstest

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRecvReturnsWhatCame(t *testing.T) {
	ch := make(chan int, 1)
	ch <- 7
	if got := Recv(t, ch, "a number"); got != 7 {
		t.Fatalf("got %d, want 7", got)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go wg.Done()
	Wait(t, &wg, "a goroutine")
}

// fatalRecorder is a test whose Fatalf is recorded, and ends its
// goroutine as testing's does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestRecvFailsWhenNothingComes(t *testing.T) {
	f := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		recvWithin(f, make(chan int), 10*time.Millisecond, "the lost message")
	}()
	Recv(t, done, "recvWithin to give up")
	if !strings.Contains(f.msg, "the lost message") {
		t.Fatalf("failure %q does not say what was lost", f.msg)
	}
}
