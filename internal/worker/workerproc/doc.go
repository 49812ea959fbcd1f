// Package workerproc proves the worker's recovery guarantees with real
// operating-system processes: worker processes (the package's test
// binary, re-executed as a worker) run multi-step runs against an
// embedded JetStream server and are killed with SIGKILL at random points,
// or stopped with SIGTERM, while the test checks what the lease, the
// epoch fencing, the checkpoints and the hand-back promise. It has no
// code of its own beyond its tests.
package workerproc
