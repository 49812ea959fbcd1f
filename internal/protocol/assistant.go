package protocol

import (
	"encoding/json"
	"time"
)

// Assistant is a LangGraph assistant: a graph (an agent profile of the
// deployment) with settings of its own. The deployment's profiles are
// read-only system assistants; users create others on them. Each change
// of a user's assistant is a new version; the record is the version
// chosen as current.
type Assistant struct {
	AssistantID string `json:"assistant_id"`
	// GraphID is the agent profile the assistant runs.
	GraphID     string `json:"graph_id"`
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Config and Context are the run settings the assistant gives its
	// runs, as the client sent them (checked: only RunConfig's keys).
	Config    json.RawMessage `json:"config,omitempty"`
	Context   json.RawMessage `json:"context,omitempty"`
	Metadata  map[string]any  `json:"metadata,omitempty"`
	Version   int             `json:"version"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
	// Tenant and Owner are set by the gateway from authentication.
	Tenant string `json:"tenant"`
	Owner  string `json:"owner,omitempty"`
	// LatestVersion is the highest version written (Version may be an
	// earlier one, chosen with "set latest").
	LatestVersion int `json:"latest_version,omitempty"`
}
