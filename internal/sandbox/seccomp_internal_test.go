package sandbox

import (
	"encoding/binary"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The filter's logic, run in x/net/bpf's virtual machine over
// seccomp_data (which that machine reads big-endian, the kernel native).
func TestSeccompProgram(t *testing.T) {
	arch := uint32(unix.AUDIT_ARCH_X86_64)
	vm, err := bpf.NewVM(seccompProgram(arch))
	if err != nil {
		t.Fatal(err)
	}
	call := func(nr, arch uint32) uint32 {
		data := make([]byte, 64)
		binary.BigEndian.PutUint32(data[0:], nr)
		binary.BigEndian.PutUint32(data[4:], arch)
		v, err := vm.Run(data)
		if err != nil {
			t.Fatal(err)
		}
		return uint32(v)
	}
	eperm := uint32(unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM))
	for _, nr := range deniedSyscalls {
		if got := call(nr, arch); got != eperm {
			t.Errorf("syscall %d: %#x, want EPERM", nr, got)
		}
	}
	for _, nr := range []uint32{unix.SYS_READ, unix.SYS_WRITE, unix.SYS_EXECVE, unix.SYS_CLONE, unix.SYS_OPENAT} {
		if got := call(nr, arch); got != unix.SECCOMP_RET_ALLOW {
			t.Errorf("syscall %d: %#x, want allowed", nr, got)
		}
	}
	if got := call(unix.SYS_READ|x32Bit, arch); got != eperm {
		t.Errorf("an x32 call: %#x, want EPERM", got)
	}
	// i386's keyctl is 288, a harmless call on x86_64: the arch check
	// must stop it before the numbers are compared.
	if got := call(288, 0x40000003); got != eperm {
		t.Errorf("an i386 call: %#x, want EPERM", got)
	}
	if seccompProgram(0) != nil {
		t.Error("a filter for an unknown architecture")
	}
}
