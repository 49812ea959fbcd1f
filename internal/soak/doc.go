// Package soak runs natsagent under faults for a bounded number of runs
// and time, and checks from the outside what docs/operations.md
// guarantees: every submitted run reaches exactly one terminal status and
// exactly one run.finished event, and no two runs of a thread execute at
// once. It backs `natsagent soak` and the fault tests; it starts its own
// embedded servers on loopback and never touches an existing deployment.
package soak
