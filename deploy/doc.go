// Package deploy holds natsagent's deployment files and the tests that
// check them offline: the Dockerfile, the docker compose file with its
// 3-node NATS cluster configs, and the Kubernetes manifests with the KEDA
// ScaledObject and the NATS Helm values, and the natsagent Helm chart. It has
// no code of its own; its tests parse every file with the real parsers
// (compose-go, the Kubernetes API types, nats-server's config parser,
// Helm's renderer and linter, internal/config) and check that
// the files agree with each other and with the code: ports, probe paths,
// stream and consumer names, replicas, grace periods, binaries.
//
// What they cannot check here: that the images build and run, and that a
// real Docker engine, Kubernetes cluster or KEDA accept the files. Those
// need a machine with Docker or a cluster (docs/operations.md, "Deploy").
package deploy
