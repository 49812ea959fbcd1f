package gateway

import (
	"net/http"
	"testing"
)

// TestInfo: GET /info answers what Agent Chat UI and LangGraph Studio read
// of the LangGraph server's (a version, the feature flags, a self-hosted
// host), without an API key on a gateway that requires one, and names no
// tenant.
func TestInfo(t *testing.T) {
	e, _ := newAuthEnv(t)
	var got struct {
		Version string          `json:"version"`
		Flags   map[string]bool `json:"flags"`
		Host    map[string]any  `json:"host"`
	}
	e.do("GET", "/info", nil).expect(t, http.StatusOK).decode(t, &got)
	if got.Version == "" {
		t.Error("no version")
	}
	want := map[string]bool{"assistants": true, "crons": true, "langsmith": false, "langsmith_tracing_replicas": false}
	for k, v := range want {
		if have, ok := got.Flags[k]; !ok || have != v {
			t.Errorf("flags.%s = %v (present %v), want %v", k, have, ok, v)
		}
	}
	if got.Host["kind"] != "self-hosted" {
		t.Errorf("host.kind = %v, want self-hosted", got.Host["kind"])
	}
	for _, k := range []string{"project_id", "revision_id", "tenant_id"} {
		if v, ok := got.Host[k]; !ok || v != nil {
			t.Errorf("host.%s = %v (present %v), want null", k, v, ok)
		}
	}
}
