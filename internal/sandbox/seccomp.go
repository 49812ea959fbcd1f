package sandbox

import (
	"bytes"
	"encoding/binary"
	"runtime"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// deniedSyscalls fail with EPERM in the sandbox: the kernel interfaces
// most kernel exploits go through, which a shell command has no use for
// (io_uring, eBPF, perf events, userfaultfd, keyrings), and what changes
// mounts, namespaces or the kernel itself (refused anyway to a user
// without capabilities; denied here as well, so a kernel bug in their
// permission checks is out of reach too).
var deniedSyscalls = []uint32{
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
	unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY,
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_MOVE_MOUNT, unix.SYS_OPEN_TREE,
	unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK, unix.SYS_MOUNT_SETATTR,
	unix.SYS_SETNS, unix.SYS_OPEN_BY_HANDLE_AT,
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD, unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
}

// auditArch is the seccomp architecture of this build, 0 where no filter
// is built.
func auditArch() uint32 {
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64
	}
	return 0
}

// x32Bit marks the x32 system call ABI on amd64: another numbering of the
// same calls, so any of them is denied.
const x32Bit = 0x40000000

// seccompFilter returns the filter as bwrap's --seccomp reads it (struct
// sock_filter, native byte order), or nil on an architecture without one.
// A call of another architecture (i386 through int 0x80 on amd64, whose
// numbers differ) and every denied call return EPERM; the rest is
// allowed.
func seccompFilter() ([]byte, error) {
	prog := seccompProgram(auditArch())
	if prog == nil {
		return nil, nil
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	for _, ins := range raw {
		_ = binary.Write(&b, binary.NativeEndian, struct {
			Code   uint16
			Jt, Jf uint8
			K      uint32
		}{ins.Op, ins.Jt, ins.Jf, ins.K})
	}
	return b.Bytes(), nil
}

// seccompProgram is the filter for arch, nil for arch 0.
func seccompProgram(arch uint32) []bpf.Instruction {
	if arch == 0 {
		return nil
	}
	deny := bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)}
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: arch, SkipTrue: 1},
		deny,
		bpf.LoadAbsolute{Off: 0, Size: 4}, // seccomp_data.nr
	}
	// Jumps go forward to the deny at the end: the allow sits before it.
	denyAt := len(prog) + 1 + len(deniedSyscalls) + 1
	prog = append(prog, bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: x32Bit, SkipTrue: uint8(denyAt - len(prog) - 1)})
	for _, nr := range deniedSyscalls {
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipTrue: uint8(denyAt - len(prog) - 1)})
	}
	return append(prog, bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW}, deny)
}
