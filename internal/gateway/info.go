package gateway

import (
	"net/http"
	"runtime/debug"
)

// serverInfo is GET /info as the LangGraph Agent Server answers it: its
// version, the features it serves (flags) and where it is hosted. Agent
// Chat UI calls it first to tell whether the server is up; LangGraph
// Studio reads the flags to show or hide assistants and crons.
type serverInfo struct {
	Version string    `json:"version"`
	Flags   infoFlags `json:"flags"`
	Host    infoHost  `json:"host"`
}

type infoFlags struct {
	Assistants bool `json:"assistants"`
	Crons      bool `json:"crons"`
	// LangSmith tracing: natsagent traces with OpenTelemetry, not LangSmith.
	LangSmith                bool `json:"langsmith"`
	LangSmithTracingReplicas bool `json:"langsmith_tracing_replicas"`
}

// infoHost: a natsagent gateway is always self-hosted; the LangSmith
// deployment ids are null.
type infoHost struct {
	Kind           string  `json:"kind"`
	ProjectID      *string `json:"project_id"`
	HostRevisionID *string `json:"host_revision_id"`
	RevisionID     *string `json:"revision_id"`
	TenantID       *string `json:"tenant_id"`
}

// buildVersion is the module version the binary was built from ("devel"
// for a build from a source tree).
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "devel"
}

// info serves GET /info. It is open, like /healthz: it tells nothing of
// any tenant, and a UI asks it before it holds a key.
func (s *Server) info(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, serverInfo{
		Version: buildVersion(),
		Flags:   infoFlags{Assistants: s.assistants != nil, Crons: s.crons != nil},
		Host:    infoHost{Kind: "self-hosted"},
	})
}
