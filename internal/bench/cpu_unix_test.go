//go:build unix

package bench

import (
	"crypto/sha256"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"
)

func TestRusageCPU(t *testing.T) {
	ru := syscall.Rusage{Utime: syscall.NsecToTimeval(int64(1500 * time.Millisecond)), Stime: syscall.NsecToTimeval(int64(2250 * time.Millisecond))}
	if got := rusageCPU(&ru); got != 3750*time.Millisecond {
		t.Errorf("rusageCPU = %v, want 3.75s", got)
	}
	// Work makes the process's reading grow.
	before, ok := processCPU()
	if !ok {
		t.Fatal("getrusage failed")
	}
	sum := sha256.Sum256(nil)
	for i := 0; i < 1_000_000_000; i++ {
		sum = sha256.Sum256(sum[:])
		if i%10000 == 0 {
			if now, _ := processCPU(); now > before {
				break
			}
		}
	}
	if now, _ := processCPU(); now <= before {
		t.Errorf("CPU time did not grow after work: %v then %v", before, now)
	}
	if runtime.GOOS == "linux" {
		// /proc agrees the process used CPU time (its ticks are coarser).
		if d, err := procCPU(os.Getpid()); err != nil || d <= 0 {
			t.Errorf("procCPU = %v, %v", d, err)
		}
	}
	c := cost{cpu: 10 * time.Millisecond, cpuOK: true}
	if d, ok := c.perRun(4); !ok || d != 2500*time.Microsecond {
		t.Errorf("perRun = %v %v", d, ok)
	}
	if _, ok := (cost{}).perRun(4); ok {
		t.Error("perRun without a CPU reading")
	}
}
