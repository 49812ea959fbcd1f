package deploy

import (
	"slices"
	"strings"
	"testing"
)

// The worker-sandbox image is the worker image plus what the execute
// tool's sandbox needs: bubblewrap on a Debian userland, the same binary,
// the same unprivileged user.
func TestDockerfileWorkerSandbox(t *testing.T) {
	stages := dockerfileStages(t)
	s, worker := stages["worker-sandbox"], stages["worker"]
	if s == nil || worker == nil {
		t.Fatal("Dockerfile has no worker-sandbox stage")
	}
	if !strings.HasPrefix(s.from, "debian:") {
		t.Errorf("worker-sandbox: FROM %s, want a Debian image (bubblewrap is a Debian package)", s.from)
	}
	installs := false
	for _, run := range s.all("RUN") {
		f := strings.Fields(run)
		if i := slices.Index(f, "install"); i > 0 && f[i-1] == "apt-get" && slices.Contains(f[i:], "bubblewrap") {
			installs = true
		}
	}
	if !installs {
		t.Errorf("worker-sandbox does not apt-get install bubblewrap: %v", s.all("RUN"))
	}
	for _, ins := range []string{"USER", "COPY", "ENTRYPOINT", "CMD", "EXPOSE"} {
		if got, want := s.all(ins), worker.all(ins); !slices.Equal(got, want) {
			t.Errorf("worker-sandbox %s %v, want the worker's %v", ins, got, want)
		}
	}
	if u := s.all("USER"); len(u) != 1 || strings.HasPrefix(u[0], "0") || strings.HasPrefix(u[0], "root") {
		t.Errorf("worker-sandbox runs as %v, want an unprivileged numeric user", u)
	}
}
