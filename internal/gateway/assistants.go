package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/policy"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Graph is an agent profile of the deployment as LangGraph clients see
// it: a graph, served as a read-only system assistant.
type Graph struct {
	Name        string
	Description string
}

// graphNamespace is the namespace LangGraph's server derives a graph's
// system assistant id from (uuid5 of the graph id), so an id a client
// learnt from a LangGraph server names the same graph here.
var graphNamespace = uuid.MustParse("6ba7b821-9dad-11d1-80b4-00c04fd430c8")

// systemAssistantID is the deterministic id of a graph's system assistant.
func systemAssistantID(graph string) string {
	return uuid.NewSHA1(graphNamespace, []byte(graph)).String()
}

// systemEpoch is the creation time shown for system assistants: they
// come from the configuration and have none.
var systemEpoch = time.Unix(0, 0).UTC()

// graphs returns the deployment's graphs (the default agent alone when
// Config.Graphs names none).
func (s *Server) graphs() []Graph {
	if len(s.cfg.Graphs) > 0 {
		return s.cfg.Graphs
	}
	return []Graph{{Name: s.cfg.DefaultAgent}}
}

func (s *Server) graph(name string) (Graph, bool) {
	for _, g := range s.graphs() {
		if g.Name == name {
			return g, true
		}
	}
	return Graph{}, false
}

// systemAssistant returns the system assistant of id: a graph name or
// the uuid5 of one.
func (s *Server) systemAssistant(id string) (*protocol.Assistant, bool) {
	for _, g := range s.graphs() {
		if id == g.Name || id == systemAssistantID(g.Name) {
			return &protocol.Assistant{AssistantID: systemAssistantID(g.Name), GraphID: g.Name, Name: g.Name,
				Description: g.Description, Version: 1, CreatedAt: systemEpoch, UpdatedAt: systemEpoch,
				Metadata: map[string]any{"created_by": "system"}}, true
		}
	}
	return nil, false
}

// assistantView is an assistant in LangGraph's shape.
type assistantView struct {
	AssistantID string          `json:"assistant_id"`
	GraphID     string          `json:"graph_id"`
	Config      json.RawMessage `json:"config"`
	Context     json.RawMessage `json:"context"`
	Metadata    map[string]any  `json:"metadata"`
	Version     int             `json:"version"`
	Name        string          `json:"name"`
	Description *string         `json:"description"`
	CreatedAt   time.Time       `json:"created_at"`
	UpdatedAt   time.Time       `json:"updated_at"`
}

func viewAssistant(a *protocol.Assistant) assistantView {
	v := assistantView{AssistantID: a.AssistantID, GraphID: a.GraphID, Config: a.Config, Context: a.Context,
		Metadata: a.Metadata, Version: a.Version, Name: a.Name, CreatedAt: a.CreatedAt, UpdatedAt: a.UpdatedAt}
	if isNull(v.Config) {
		v.Config = json.RawMessage(`{}`)
	}
	if isNull(v.Context) {
		v.Context = json.RawMessage(`{}`)
	}
	if v.Metadata == nil {
		v.Metadata = map[string]any{}
	}
	if a.Description != "" {
		d := a.Description
		v.Description = &d
	}
	return v
}

// assistant reads the assistant named in the path: a system assistant
// (by graph name or id) or one of the tenant's.
func (s *Server) assistant(ctx context.Context, tenant, id string) (*protocol.Assistant, uint64, error) {
	if a, ok := s.systemAssistant(id); ok {
		return a, 0, nil
	}
	if s.assistants == nil {
		return nil, 0, errNotFound(fmt.Sprintf("assistant %s not found", id))
	}
	a, rev, err := s.assistants.Get(ctx, tenant, id)
	if errors.Is(err, kv.ErrNotFound) {
		return nil, 0, errNotFound(fmt.Sprintf("assistant %s not found", id))
	}
	return a, rev, err
}

func (s *Server) pathAssistant(r *http.Request, tenant string) (*protocol.Assistant, uint64, error) {
	id, err := pathToken(r, "assistant_id")
	if err != nil {
		return nil, 0, err
	}
	return s.assistant(r.Context(), tenant, id)
}

// assistantSettings checks an assistant's config and context: the keys a
// run's config may set (runConfig refuses others by name), valid values,
// and no user_id (a run acts for whoever starts it). It returns what they
// set.
func assistantSettings(tenant, graph string, config, ctxRaw json.RawMessage) (protocol.RunConfig, error) {
	cfg, err := runConfig(config, ctxRaw)
	if err != nil {
		return cfg, err
	}
	if cfg.UserID != "" {
		return cfg, errInvalid("config.user_id", "an assistant may not set user_id: a run acts for the user who starts it")
	}
	probe := protocol.RunRequest{RunID: "probe", ThreadID: "probe", Tenant: tenant, Agent: graph, Config: cfg,
		Input: &protocol.Input{Messages: []model.Message{{Role: "user", Content: "probe"}}}}
	probe.Normalize()
	if err := probe.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// mayWriteAssistant decides whether the request may create an assistant
// on a graph with settings cfg: whoever may run the graph with those
// settings (policy.Check). On an open gateway anyone may.
func (s *Server) mayWriteAssistant(r *http.Request, tenant, graph string, cfg protocol.RunConfig) error {
	p, ok := principalOf(r)
	if !ok {
		return nil
	}
	pr := p.p
	err := s.cfg.Policy.Check(tenant, &pr, &protocol.RunRequest{Tenant: tenant, Agent: graph, Config: cfg})
	var pe *policy.Error
	if errors.As(err, &pe) {
		return &apiError{status: http.StatusForbidden, code: CodeForbidden, msg: pe.Error()}
	}
	return err
}

// mayChangeAssistant decides whether the request may patch, delete or
// set the version of a: its creator, a role with read_all_threads, or
// anyone on an open gateway. System assistants are read-only.
func (s *Server) mayChangeAssistant(r *http.Request, a *protocol.Assistant) error {
	if a.Tenant == "" {
		return &apiError{status: http.StatusForbidden, code: CodeForbidden,
			msg: fmt.Sprintf("assistant %s is the graph %s of the deployment's configuration and is read-only; create an assistant on it instead", a.AssistantID, a.GraphID)}
	}
	p, ok := principalOf(r)
	if !ok || a.Owner == "" || a.Owner == p.p.User || s.cfg.Policy.ReadAllThreads(&p.p) {
		return nil
	}
	return &apiError{status: http.StatusForbidden, code: CodeForbidden,
		msg: fmt.Sprintf("assistant %s belongs to another user; only its creator or a role with read_all_threads may change it", a.AssistantID)}
}

func (s *Server) needAssistants() error {
	if s.assistants == nil {
		return errUnavailable("this deployment has no assistants bucket: provision it with this version", nil)
	}
	return nil
}

type createAssistantBody struct {
	AssistantID string          `json:"assistant_id"`
	GraphID     string          `json:"graph_id"`
	Config      json.RawMessage `json:"config"`
	Context     json.RawMessage `json:"context"`
	Metadata    map[string]any  `json:"metadata"`
	IfExists    string          `json:"if_exists"`
	Name        string          `json:"name"`
	Description *string         `json:"description"`
}

// maxAssistantText bounds an assistant's name and description.
const maxAssistantText = 4096

// createAssistant: POST /assistants.
func (s *Server) createAssistant(w http.ResponseWriter, r *http.Request, tenant string) error {
	if err := s.needAssistants(); err != nil {
		return err
	}
	var b createAssistantBody
	if err := decodeBody(r, &b); err != nil {
		return err
	}
	switch b.IfExists {
	case "", "raise", "do_nothing":
	default:
		return errInvalid("if_exists", fmt.Sprintf("%q is not one of raise, do_nothing", clip(b.IfExists)))
	}
	if _, ok := s.graph(b.GraphID); !ok {
		return errInvalid("graph_id", fmt.Sprintf("graph_id %q is not a graph of this deployment: use one of %s", clip(b.GraphID), strings.Join(s.graphNames(), ", ")))
	}
	if b.AssistantID == "" {
		b.AssistantID = uuid.NewString()
	}
	if err := protocol.CheckToken("assistant_id", b.AssistantID); err != nil {
		return err
	}
	if _, ok := s.systemAssistant(b.AssistantID); ok {
		return errConflict(fmt.Sprintf("assistant %s is a graph of the deployment; choose another id", b.AssistantID))
	}
	if err := checkAssistantText(b.Name, b.Description); err != nil {
		return err
	}
	cfg, err := assistantSettings(tenant, b.GraphID, b.Config, b.Context)
	if err != nil {
		return err
	}
	if err := s.mayWriteAssistant(r, tenant, b.GraphID, cfg); err != nil {
		return err
	}
	now := time.Now().UTC()
	a := &protocol.Assistant{AssistantID: b.AssistantID, GraphID: b.GraphID, Name: b.Name, Config: compactRaw(b.Config),
		Context: compactRaw(b.Context), Metadata: b.Metadata, CreatedAt: now, UpdatedAt: now, Tenant: tenant, Owner: ownerOf(r)}
	if a.Name == "" {
		a.Name = b.GraphID
	}
	if b.Description != nil {
		a.Description = *b.Description
	}
	err = s.assistants.Create(r.Context(), a)
	if errors.Is(err, kv.ErrExists) {
		if b.IfExists != "do_nothing" {
			return errConflict(fmt.Sprintf("assistant %s already exists; send \"if_exists\": \"do_nothing\" to get it instead", b.AssistantID))
		}
		a, _, err = s.assistant(r.Context(), tenant, b.AssistantID)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewAssistant(a))
	return nil
}

func checkAssistantText(name string, desc *string) error {
	if len(name) > maxAssistantText {
		return errInvalid("name", fmt.Sprintf("name is longer than %d bytes", maxAssistantText))
	}
	if desc != nil && len(*desc) > maxAssistantText {
		return errInvalid("description", fmt.Sprintf("description is longer than %d bytes", maxAssistantText))
	}
	return nil
}

// compactRaw drops a JSON null, so an absent setting stays absent.
func compactRaw(raw json.RawMessage) json.RawMessage {
	if isNull(raw) {
		return nil
	}
	return raw
}

func (s *Server) graphNames() []string {
	var out []string
	for _, g := range s.graphs() {
		out = append(out, g.Name)
	}
	return out
}

// getAssistant: GET /assistants/{assistant_id}.
func (s *Server) getAssistant(w http.ResponseWriter, r *http.Request, tenant string) error {
	a, _, err := s.pathAssistant(r, tenant)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewAssistant(a))
	return nil
}

type patchAssistantBody struct {
	GraphID     *string         `json:"graph_id"`
	Config      json.RawMessage `json:"config"`
	Context     json.RawMessage `json:"context"`
	Metadata    map[string]any  `json:"metadata"`
	Name        *string         `json:"name"`
	Description *string         `json:"description"`
}

// patchAssistant: PATCH /assistants/{assistant_id}, a new version. A
// field sent replaces the current one; metadata is merged.
func (s *Server) patchAssistant(w http.ResponseWriter, r *http.Request, tenant string) error {
	var b patchAssistantBody
	if err := decodeBody(r, &b); err != nil {
		return err
	}
	if err := checkAssistantText(deref(b.Name), b.Description); err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		cur, rev, err := s.pathAssistant(r, tenant)
		if err != nil {
			return err
		}
		if err := s.mayChangeAssistant(r, cur); err != nil {
			return err
		}
		next := *cur
		if b.GraphID != nil {
			if _, ok := s.graph(*b.GraphID); !ok {
				return errInvalid("graph_id", fmt.Sprintf("graph_id %q is not a graph of this deployment: use one of %s", clip(*b.GraphID), strings.Join(s.graphNames(), ", ")))
			}
			next.GraphID = *b.GraphID
		}
		if b.Config != nil {
			next.Config = compactRaw(b.Config)
		}
		if b.Context != nil {
			next.Context = compactRaw(b.Context)
		}
		if b.Name != nil {
			next.Name = *b.Name
		}
		if b.Description != nil {
			next.Description = *b.Description
		}
		if b.Metadata != nil {
			merged := make(map[string]any, len(cur.Metadata)+len(b.Metadata))
			for k, v := range cur.Metadata {
				merged[k] = v
			}
			for k, v := range b.Metadata {
				merged[k] = v
			}
			next.Metadata = merged
		}
		cfg, err := assistantSettings(tenant, next.GraphID, next.Config, next.Context)
		if err != nil {
			return err
		}
		if err := s.mayWriteAssistant(r, tenant, next.GraphID, cfg); err != nil {
			return err
		}
		next.UpdatedAt = time.Now().UTC()
		err = s.assistants.Update(r.Context(), &next, rev)
		if errors.Is(err, kv.ErrConflict) && attempt < 5 {
			continue
		}
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, viewAssistant(&next))
		return nil
	}
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// deleteAssistant: DELETE /assistants/{assistant_id}. Its threads stay
// (delete_threads is refused: threads do not record their assistant).
func (s *Server) deleteAssistant(w http.ResponseWriter, r *http.Request, tenant string) error {
	if v := r.URL.Query().Get("delete_threads"); v == "true" {
		return errInvalid("delete_threads", "delete_threads is not supported: threads do not record the assistant that ran them; delete them with DELETE /threads/{thread_id}")
	}
	a, _, err := s.pathAssistant(r, tenant)
	if err != nil {
		return err
	}
	if err := s.mayChangeAssistant(r, a); err != nil {
		return err
	}
	if err := s.assistants.Delete(r.Context(), tenant, a.AssistantID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

type latestBody struct {
	Version *int `json:"version"`
}

// setLatestAssistant: POST /assistants/{assistant_id}/latest, make an
// earlier (or later) version current.
func (s *Server) setLatestAssistant(w http.ResponseWriter, r *http.Request, tenant string) error {
	var b latestBody
	if err := decodeBody(r, &b); err != nil {
		return err
	}
	if b.Version == nil {
		return errInvalid("version", "version is required")
	}
	cur, rev, err := s.pathAssistant(r, tenant)
	if err != nil {
		return err
	}
	if err := s.mayChangeAssistant(r, cur); err != nil {
		return err
	}
	if *b.Version < 1 || *b.Version > cur.LatestVersion {
		return errNotFound(fmt.Sprintf("assistant %s has no version %d (versions 1 to %d)", cur.AssistantID, *b.Version, cur.LatestVersion))
	}
	a, err := s.assistants.SetCurrent(r.Context(), cur, rev, *b.Version)
	if errors.Is(err, kv.ErrNotFound) {
		return errNotFound(fmt.Sprintf("assistant %s has no version %d", cur.AssistantID, *b.Version))
	}
	if errors.Is(err, kv.ErrConflict) {
		return errConflict(fmt.Sprintf("assistant %s changed meanwhile; read it and try again", cur.AssistantID))
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewAssistant(a))
	return nil
}

type versionsBody struct {
	Metadata map[string]any `json:"metadata"`
	Limit    *int           `json:"limit"`
	Offset   *int           `json:"offset"`
}

// assistantVersions: POST /assistants/{assistant_id}/versions, newest
// first.
func (s *Server) assistantVersions(w http.ResponseWriter, r *http.Request, tenant string) error {
	var b versionsBody
	if err := decodeBody(r, &b); err != nil {
		return err
	}
	p, err := bodyPage(b.Limit, b.Offset, 10)
	if err != nil {
		return err
	}
	cur, _, err := s.pathAssistant(r, tenant)
	if err != nil {
		return err
	}
	var all []*protocol.Assistant
	if cur.Tenant == "" {
		all = []*protocol.Assistant{cur}
	} else if all, err = s.assistants.Versions(r.Context(), tenant, cur.AssistantID); err != nil {
		return err
	}
	out := []assistantView{}
	for _, a := range all {
		if matchMetadata(a.Metadata, b.Metadata) {
			out = append(out, viewAssistant(a))
		}
	}
	writeJSON(w, http.StatusOK, paginate(p, out))
	return nil
}

// bodyPage reads a search body's limit and offset.
func bodyPage(limit, offset *int, def int) (page, error) {
	p := page{limit: def}
	if limit != nil {
		if *limit < 1 || *limit > maxLimit {
			return p, errInvalid("limit", fmt.Sprintf("limit must be a number from 1 to %d", maxLimit))
		}
		p.limit = *limit
	}
	if offset != nil {
		if *offset < 0 || *offset > maxOffset {
			return p, errInvalid("offset", fmt.Sprintf("offset must be a number from 0 to %d", maxOffset))
		}
		p.offset = *offset
	}
	return p, nil
}

// matchMetadata reports whether have holds every key of want with an
// equal value (LangGraph's metadata filter: containment).
func matchMetadata(have, want map[string]any) bool {
	for k, wv := range want {
		hv, ok := have[k]
		if !ok || !jsonEqual(hv, wv) {
			return false
		}
	}
	return true
}

func jsonEqual(a, b any) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	if err1 != nil || err2 != nil {
		return false
	}
	var va, vb any
	if json.Unmarshal(ja, &va) != nil || json.Unmarshal(jb, &vb) != nil {
		return false
	}
	ca, _ := json.Marshal(va)
	cb, _ := json.Marshal(vb)
	return string(ca) == string(cb)
}

type searchAssistantsBody struct {
	GraphID   string         `json:"graph_id"`
	Name      string         `json:"name"`
	Metadata  map[string]any `json:"metadata"`
	Limit     *int           `json:"limit"`
	Offset    *int           `json:"offset"`
	SortBy    string         `json:"sort_by"`
	SortOrder string         `json:"sort_order"`
	Select    []string       `json:"select"`
}

// tenantAssistants returns the system assistants and the tenant's
// assistants matching b's filters.
func (s *Server) tenantAssistants(ctx context.Context, tenant string, b *searchAssistantsBody) ([]*protocol.Assistant, error) {
	var all []*protocol.Assistant
	for _, g := range s.graphs() {
		a, _ := s.systemAssistant(g.Name)
		all = append(all, a)
	}
	if s.assistants != nil {
		mine, err := s.assistants.List(ctx, tenant)
		if err != nil {
			return nil, err
		}
		all = append(all, mine...)
	}
	out := all[:0]
	for _, a := range all {
		if b.GraphID != "" && a.GraphID != b.GraphID ||
			b.Name != "" && !strings.Contains(strings.ToLower(a.Name), strings.ToLower(b.Name)) ||
			!matchMetadata(a.Metadata, b.Metadata) {
			continue
		}
		out = append(out, a)
	}
	return out, nil
}

var assistantFields = map[string]bool{"assistant_id": true, "graph_id": true, "name": true, "description": true,
	"config": true, "context": true, "metadata": true, "version": true, "created_at": true, "updated_at": true}

// searchAssistants: POST /assistants/search.
func (s *Server) searchAssistants(w http.ResponseWriter, r *http.Request, tenant string) error {
	var b searchAssistantsBody
	if err := decodeBody(r, &b); err != nil {
		return err
	}
	p, err := bodyPage(b.Limit, b.Offset, 10)
	if err != nil {
		return err
	}
	for _, f := range b.Select {
		if !assistantFields[f] {
			return errInvalid("select", fmt.Sprintf("select: %q is not a field of an assistant", clip(f)))
		}
	}
	cmp, err := assistantOrder(b.SortBy, b.SortOrder)
	if err != nil {
		return err
	}
	all, err := s.tenantAssistants(r.Context(), tenant, &b)
	if err != nil {
		return err
	}
	slices.SortStableFunc(all, cmp)
	views := make([]assistantView, 0, len(all))
	for _, a := range all {
		views = append(views, viewAssistant(a))
	}
	writePage(w, p.offset, paginate(p, views), len(views), b.Select)
	return nil
}

// writePage answers one page of a LangGraph search: items are the views
// from offset on, total how many matched (negative when the search did not
// read far enough to know: no X-Pagination-Total). X-Pagination-Next names the next
// page's offset while there is one (the SDK's includePagination reads it);
// sel, when set, keeps the fields it names.
func writePage[T any](w http.ResponseWriter, offset int, items []T, total int, sel []string) {
	switch {
	case total < 0:
		// Unknown (a thread search that read only the newest threads):
		// a next page may follow if this one is full.
		if len(items) > 0 {
			w.Header().Set("X-Pagination-Next", fmt.Sprint(offset+len(items)))
		}
	default:
		if offset+len(items) < total {
			w.Header().Set("X-Pagination-Next", fmt.Sprint(offset+len(items)))
		}
		w.Header().Set("X-Pagination-Total", fmt.Sprint(total))
	}
	if len(sel) == 0 {
		writeJSON(w, http.StatusOK, items)
		return
	}
	writeJSON(w, http.StatusOK, selectFields(items, sel))
}

// selectFields keeps the fields named in sel of each item.
func selectFields[T any](items []T, sel []string) []map[string]json.RawMessage {
	out := make([]map[string]json.RawMessage, 0, len(items))
	for _, it := range items {
		data, _ := json.Marshal(it)
		var all map[string]json.RawMessage
		_ = json.Unmarshal(data, &all)
		m := make(map[string]json.RawMessage, len(sel))
		for _, f := range sel {
			if v, ok := all[f]; ok {
				m[f] = v
			} else {
				m[f] = json.RawMessage("null")
			}
		}
		out = append(out, m)
	}
	return out
}

// assistantOrder is the order an assistants search sorts by.
func assistantOrder(by, order string) (func(a, b *protocol.Assistant) int, error) {
	return listOrder(by, order, "created_at", map[string]func(a, b *protocol.Assistant) int{
		"created_at":   func(a, b *protocol.Assistant) int { return a.CreatedAt.Compare(b.CreatedAt) },
		"updated_at":   func(a, b *protocol.Assistant) int { return a.UpdatedAt.Compare(b.UpdatedAt) },
		"assistant_id": func(a, b *protocol.Assistant) int { return 0 },
		"graph_id":     func(a, b *protocol.Assistant) int { return strings.Compare(a.GraphID, b.GraphID) },
		"name":         func(a, b *protocol.Assistant) int { return strings.Compare(a.Name, b.Name) },
	}, func(a *protocol.Assistant) string { return a.AssistantID })
}

// countAssistants: POST /assistants/count.
func (s *Server) countAssistants(w http.ResponseWriter, r *http.Request, tenant string) error {
	var b searchAssistantsBody
	if err := decodeBody(r, &b); err != nil {
		return err
	}
	all, err := s.tenantAssistants(r.Context(), tenant, &b)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, len(all))
	return nil
}

// runAssistant resolves a run's assistant_id: a graph name (or no id) is
// today's agent; an assistant's id names its graph and the settings the
// run's own config leaves empty.
func (s *Server) runAssistant(ctx context.Context, tenant string, b *runBody) (*protocol.RunConfig, error) {
	id := b.AssistantID
	if id == "" || !protocol.ValidToken(id) {
		return nil, nil
	}
	if a, ok := s.systemAssistant(id); ok {
		b.AssistantID = a.GraphID
		return nil, nil
	}
	if s.assistants == nil {
		return nil, nil
	}
	a, _, err := s.assistants.Get(ctx, tenant, id)
	if errors.Is(err, kv.ErrNotFound) {
		return nil, nil // an agent name the worker checks
	}
	if err != nil {
		return nil, err
	}
	cfg, err := runConfig(a.Config, a.Context)
	if err != nil {
		return nil, fmt.Errorf("assistant %s: stored config: %w", id, err)
	}
	b.AssistantID = a.GraphID
	return &cfg, nil
}

// underRun fills the settings run leaves empty from an assistant's.
func underRun(run *protocol.RunConfig, a protocol.RunConfig) {
	if run.Model == "" {
		run.Model = a.Model
	}
	if run.ToolApprovalMode == "" {
		run.ToolApprovalMode = a.ToolApprovalMode
	}
	if run.MaxSteps == 0 {
		run.MaxSteps = a.MaxSteps
	}
	if run.TimeoutSeconds == 0 {
		run.TimeoutSeconds = a.TimeoutSeconds
	}
	if run.Clarification == nil {
		run.Clarification = a.Clarification
	}
	if run.Subagents == nil {
		run.Subagents = a.Subagents
	}
	if run.PlanMode == nil {
		run.PlanMode = a.PlanMode
	}
}

// graphView is an assistant's graph in LangGraph's drawable shape: the
// nodes of LangChain's create_agent (model and tools), which every
// natsagent agent is.
func graphView() map[string]any {
	node := func(id, typ string) map[string]any {
		return map[string]any{"id": id, "type": typ, "data": id}
	}
	edge := func(src, dst string, cond bool) map[string]any {
		return map[string]any{"source": src, "target": dst, "conditional": cond}
	}
	return map[string]any{
		"nodes": []any{node("__start__", "schema"), node("model", "runnable"), node("tools", "runnable"), node("__end__", "schema")},
		"edges": []any{edge("__start__", "model", false), edge("model", "tools", true), edge("model", "__end__", true), edge("tools", "model", false)},
	}
}

// assistantGraph: GET /assistants/{assistant_id}/graph.
func (s *Server) assistantGraph(w http.ResponseWriter, r *http.Request, tenant string) error {
	if _, _, err := s.pathAssistant(r, tenant); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, graphView())
	return nil
}

// assistantSubgraphs: GET /assistants/{assistant_id}/subgraphs: none (a
// subagent is a run of its own, not a subgraph).
func (s *Server) assistantSubgraphs(w http.ResponseWriter, r *http.Request, tenant string) error {
	if _, _, err := s.pathAssistant(r, tenant); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{})
	return nil
}

// assistantSchemas: GET /assistants/{assistant_id}/schemas.
func (s *Server) assistantSchemas(w http.ResponseWriter, r *http.Request, tenant string) error {
	a, _, err := s.pathAssistant(r, tenant)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"graph_id":       a.GraphID,
		"input_schema":   inputSchema,
		"output_schema":  stateSchema,
		"state_schema":   stateSchema,
		"config_schema":  configSchema,
		"context_schema": contextSchema,
	})
	return nil
}

// settingsProperties are the run settings an assistant's config or
// context may set (runConfigKeys without user_id).
var settingsProperties = map[string]any{
	"model":              map[string]any{"type": "string", "description": "the model name sent to the provider"},
	"tool_approval_mode": map[string]any{"type": "string", "enum": []string{protocol.ApprovalDefault, protocol.ApprovalAlwaysTrust, protocol.ApprovalAlwaysAsk}},
	"max_steps":          map[string]any{"type": "integer", "minimum": 1, "maximum": protocol.MaxRunSteps},
	"timeout_seconds":    map[string]any{"type": "integer", "minimum": 1, "maximum": protocol.MaxTimeoutSeconds},
	"clarification":      map[string]any{"type": "boolean", "description": "false: the run may not ask the person a question"},
	"subagents":          map[string]any{"type": "boolean", "description": "false: the run may not start subagents"},
	"plan_mode":          map[string]any{"type": "boolean", "description": "false: no todo list (write_todos) for the run"},
}

var contextSchema = map[string]any{"title": "Context", "type": "object", "properties": settingsProperties, "additionalProperties": false}

var configSchema = map[string]any{"title": "Configurable", "type": "object", "properties": settingsProperties, "additionalProperties": false}

var messageSchema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"type":    map[string]any{"type": "string", "enum": []string{"human", "ai", "tool", "system"}},
		"role":    map[string]any{"type": "string", "enum": []string{"user", "assistant", "tool", "system"}},
		"content": map[string]any{"anyOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "array", "items": map[string]any{"type": "object"}}}},
		"id":      map[string]any{"type": "string"},
	},
	"required": []string{"content"},
}

var inputSchema = map[string]any{
	"title": "Input", "type": "object",
	"properties": map[string]any{"messages": map[string]any{"type": "array", "items": messageSchema}},
	"required":   []string{"messages"},
}

var stateSchema = map[string]any{
	"title": "State", "type": "object",
	"properties": map[string]any{
		"messages": map[string]any{"type": "array", "items": messageSchema},
		"todos":    map[string]any{"type": "array", "items": map[string]any{"type": "object"}},
	},
	"additionalProperties": true,
}
