package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/natsagent/natsagent/internal/crons"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/protocol"
)

// A cron's own fields, beside its run payload.
var cronFields = map[string]bool{"schedule": true, "timezone": true, "end_time": true, "enabled": true, "on_run_completed": true}

// Run options a cron's payload may not carry: each tick has its own run
// and, when stateless, its own thread.
var cronRefused = map[string]string{
	"run_id":        "each tick has its own run id",
	"after_seconds": "the schedule says when a run starts",
	"if_not_exists": "a cron's thread must exist; a stateless cron creates one each tick",
	"on_disconnect": "a cron's run has no client to disconnect",
	"checkpoint":    "a cron's run starts from the thread's latest state",
	"checkpoint_id": "a cron's run starts from the thread's latest state",
	"on_completion": "use on_run_completed",
}

// cronBody splits a cron body into its own fields and its run payload.
func cronBody(r *http.Request) (own, payload map[string]json.RawMessage, err error) {
	var all map[string]json.RawMessage
	if err := decodeBody(r, &all); err != nil {
		return nil, nil, err
	}
	own, payload = map[string]json.RawMessage{}, map[string]json.RawMessage{}
	for k, v := range all {
		switch {
		case cronFields[k]:
			own[k] = v
		case cronRefused[k] != "":
			if !isNull(v) {
				return nil, nil, errInvalid(k, fmt.Sprintf("%s is not a cron option: %s", k, cronRefused[k]))
			}
		default:
			payload[k] = v
		}
	}
	return own, payload, nil
}

// cronRequest builds and authorizes the run request a cron's ticks
// submit, from its payload.
func (s *Server) cronRequest(r *http.Request, tenant, thread string, payload map[string]json.RawMessage) (*protocol.RunRequest, map[string]any, error) {
	data, err := json.Marshal(payload)
	if err != nil {
		return nil, nil, err
	}
	var body runBody
	if err := json.Unmarshal(data, &body); err != nil {
		return nil, nil, errInvalid("", "the cron's run payload does not decode: "+err.Error())
	}
	req, err := s.request(&body, tenant, thread)
	if err != nil {
		return nil, nil, err
	}
	for _, img := range body.images {
		if img.ref != nil {
			// A cron's runs start on threads that do not exist yet.
			return nil, nil, errInvalid(img.field, img.field+": a cron's input cannot carry images; use an http(s) image URL")
		}
	}
	if err := s.authorize(r, tenant, req); err != nil {
		return nil, nil, err
	}
	if err := s.checkWebhook(r.Context(), req); err != nil {
		return nil, nil, err
	}
	if l := s.cfg.Limits; l != nil {
		if err := l.For(tenant).CheckRequest(req); err != nil {
			return nil, nil, err
		}
	}
	if b, _ := json.Marshal(req); len(b) > s.cfg.Settings.MaxRequestBytes {
		return nil, nil, errTooLarge(fmt.Sprintf("the cron's run request is %d bytes, over the limit of %d bytes", len(b), s.cfg.Settings.MaxRequestBytes))
	}
	var shown map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	_ = dec.Decode(&shown)
	return req, shown, nil
}

// applyCronFields sets a cron's own fields from a body.
func applyCronFields(rec *crons.Record, own map[string]json.RawMessage) error {
	for _, k := range sortedKeys(own) {
		v := own[k]
		switch k {
		case "schedule":
			if err := json.Unmarshal(v, &rec.Schedule); err != nil {
				return errInvalid(k, "schedule must be a string")
			}
		case "timezone":
			var tz *string
			if err := json.Unmarshal(v, &tz); err != nil {
				return errInvalid(k, "timezone must be a string")
			}
			if tz != nil && *tz == "" {
				tz = nil
			}
			rec.Timezone = tz
		case "end_time":
			var et *time.Time
			if err := json.Unmarshal(v, &et); err != nil {
				return errInvalid(k, "end_time must be an RFC 3339 date-time or null")
			}
			if et != nil {
				u := et.UTC()
				et = &u
			}
			rec.EndTime = et
		case "enabled":
			if isNull(v) {
				continue
			}
			if err := json.Unmarshal(v, &rec.Enabled); err != nil {
				return errInvalid(k, "enabled must be a boolean")
			}
		case "on_run_completed":
			var o string
			_ = json.Unmarshal(v, &o)
			switch o {
			case "", "keep":
			case "delete":
				return errInvalid(k, "delete is not served: natsagent keeps the thread of a run; delete it with DELETE /threads/{thread_id}")
			default:
				return errInvalid(k, fmt.Sprintf("%q is not one of keep, delete", clip(o)))
			}
			rec.OnRunCompleted = o
		}
	}
	if rec.Schedule == "" {
		return errInvalid("schedule", "schedule is required: a cron expression such as \"0 9 * * *\"")
	}
	if _, err := rec.Spec(); err != nil {
		field := "schedule"
		if rec.Timezone != nil {
			if _, terr := time.LoadLocation(*rec.Timezone); terr != nil {
				field = "timezone"
			}
		}
		return errInvalid(field, err.Error())
	}
	return nil
}

// cronPlaceholderThread is the thread of a stateless cron's request
// template; each tick replaces it.
const cronPlaceholderThread = "cron"

// createCron: POST /runs/crons (stateless: each tick a new thread) and
// POST /threads/{thread_id}/runs/crons.
func (s *Server) createCron(onThread bool) tenantHandler {
	return func(w http.ResponseWriter, r *http.Request, tenant string) error {
		thread := cronPlaceholderThread
		if onThread {
			var err error
			if thread, err = pathToken(r, "thread_id"); err != nil {
				return err
			}
			th, _, err := s.stores.Threads.Get(r.Context(), tenant, thread)
			if errors.Is(err, kv.ErrNotFound) {
				return errNotFound(fmt.Sprintf("thread %s not found", thread))
			}
			if err != nil {
				return err
			}
			if th.Status == protocol.ThreadDeleting {
				return errDeleting(thread)
			}
		}
		own, payload, err := cronBody(r)
		if err != nil {
			return err
		}
		req, shown, err := s.cronRequest(r, tenant, thread, payload)
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		rec := &crons.Record{Tenant: tenant, Owner: ownerOf(r), Request: *req}
		rec.CronID, rec.AssistantID, rec.Payload, rec.Enabled = newID(), req.Agent, shown, true
		rec.CreatedAt, rec.UpdatedAt = now, now
		rec.Metadata = req.Metadata
		if rec.Metadata == nil {
			rec.Metadata = map[string]any{}
		}
		if onThread {
			rec.ThreadID = &thread
		}
		if u := req.Config.UserID; u != "" {
			rec.UserID = &u
		} else if u := ownerOf(r); u != "" {
			rec.UserID = &u
		}
		if err := applyCronFields(rec, own); err != nil {
			return err
		}
		ctx := r.Context()
		// The tenant's creates take turns, so two cannot both take the
		// last place under the cap.
		err = s.crons.WithTenantLock(ctx, tenant, func() error {
			if err := s.underCronCap(ctx, tenant); err != nil {
				return err
			}
			_, err := s.crons.Put(ctx, rec, 0)
			return err
		})
		if errors.Is(err, crons.ErrBusy) {
			return errUnavailable("the tenant's crons are busy; try again", err)
		}
		if err != nil {
			return err
		}
		if err := s.crons.Schedule(ctx, rec); err != nil {
			_ = s.crons.Delete(ctx, tenant, rec.CronID)
			return err
		}
		writeJSON(w, http.StatusOK, rec.View(time.Now()))
		return nil
	}
}

// DefaultMaxCronsPerTenant is how many crons a tenant may have when
// Config.MaxCronsPerTenant sets no number.
const DefaultMaxCronsPerTenant = 100

// maxCrons is the deployment's cap on a tenant's crons.
func (s *Server) maxCrons() int {
	if s.cfg.MaxCronsPerTenant > 0 {
		return s.cfg.MaxCronsPerTenant
	}
	return DefaultMaxCronsPerTenant
}

// underCronCap refuses a cron past the tenant's cap with a 409. It reads
// the tenant's crons by their key prefix ("<tenant>."), never the
// deployment's; the cap bounds what it reads.
func (s *Server) underCronCap(ctx context.Context, tenant string) error {
	all, err := s.crons.List(ctx, tenant)
	if err != nil {
		return err
	}
	if limit := s.maxCrons(); len(all) >= limit {
		return &apiError{status: http.StatusConflict, code: protocol.CodeConflict, field: "cron",
			msg: fmt.Sprintf("tenant %s has %d crons, the most this deployment allows (crons.max_per_tenant); delete one before creating another", tenant, len(all))}
	}
	return nil
}

// cronOf reads the cron named in the path, if the request may use it
// (its creator's, or any with a role that reads all threads).
func (s *Server) cronOf(r *http.Request, tenant string) (*crons.Record, uint64, error) {
	id, err := pathToken(r, "cron_id")
	if err != nil {
		return nil, 0, err
	}
	rec, rev, err := s.crons.Get(r.Context(), tenant, id)
	if errors.Is(err, crons.ErrNotFound) || (err == nil && !s.mayUseCron(r, rec)) {
		return nil, 0, errNotFound(fmt.Sprintf("cron %s not found", id))
	}
	return rec, rev, err
}

func (s *Server) mayUseCron(r *http.Request, rec *crons.Record) bool {
	return s.mayUse(r, &protocol.Thread{Tenant: rec.Tenant, ThreadID: rec.CronID, Owner: rec.Owner})
}

// getCron: GET /runs/crons/{cron_id}.
func (s *Server) getCron(w http.ResponseWriter, r *http.Request, tenant string) error {
	rec, _, err := s.cronOf(r, tenant)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, rec.View(time.Now()))
	return nil
}

// Payload keys a patch may change (the SDK's CronsUpdatePayload).
var cronPatchPayload = map[string]bool{"input": true, "metadata": true, "config": true, "context": true, "webhook": true,
	"interrupt_before": true, "interrupt_after": true, "stream_mode": true, "stream_subgraphs": true, "stream_resumable": true,
	"durability": true, "checkpoint_during": true, "multitask_strategy": true, "assistant_id": true, "command": true}

// patchCron: PATCH /runs/crons/{cron_id}. The fields sent replace the
// cron's (null clears end_time); the run payload is validated and
// authorized again, and the schedule rewritten.
func (s *Server) patchCron(w http.ResponseWriter, r *http.Request, tenant string) error {
	rec, rev, err := s.cronOf(r, tenant)
	if err != nil {
		return err
	}
	own, patch, err := cronBody(r)
	if err != nil {
		return err
	}
	payload := map[string]json.RawMessage{}
	for k, v := range rec.Payload {
		b, _ := json.Marshal(v)
		payload[k] = b
	}
	for _, k := range sortedKeys(patch) {
		if !cronPatchPayload[k] {
			return errInvalid(clip(k), fmt.Sprintf("%q is not a field a cron's update may change", clip(k)))
		}
		if isNull(patch[k]) {
			delete(payload, k)
		} else {
			payload[k] = patch[k]
		}
	}
	thread := cronPlaceholderThread
	if rec.ThreadID != nil {
		thread = *rec.ThreadID
	}
	req, shown, err := s.cronRequest(r, tenant, thread, payload)
	if err != nil {
		return err
	}
	if err := applyCronFields(rec, own); err != nil {
		return err
	}
	rec.Request, rec.Payload, rec.AssistantID = *req, shown, req.Agent
	if _, ok := patch["metadata"]; ok {
		rec.Metadata = req.Metadata
		if rec.Metadata == nil {
			rec.Metadata = map[string]any{}
		}
	}
	rec.UpdatedAt = time.Now().UTC()
	if _, err := s.crons.Put(r.Context(), rec, rev); err != nil {
		if errors.Is(err, crons.ErrConflict) {
			return errConflict(fmt.Sprintf("cron %s changed meanwhile; read it and patch again", rec.CronID))
		}
		return err
	}
	if err := s.crons.Schedule(r.Context(), rec); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, rec.View(time.Now()))
	return nil
}

// deleteCron: DELETE /runs/crons/{cron_id}. The schedule is purged
// first: the cron never fires again.
func (s *Server) deleteCron(w http.ResponseWriter, r *http.Request, tenant string) error {
	rec, _, err := s.cronOf(r, tenant)
	if err != nil {
		return err
	}
	if err := s.crons.Delete(r.Context(), tenant, rec.CronID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

type cronQuery struct {
	AssistantID string         `json:"assistant_id"`
	ThreadID    string         `json:"thread_id"`
	Enabled     *bool          `json:"enabled"`
	Metadata    map[string]any `json:"metadata"`
	Limit       *int           `json:"limit"`
	Offset      int            `json:"offset"`
	SortBy      string         `json:"sort_by"`
	SortOrder   string         `json:"sort_order"`
	Select      []string       `json:"select"`
}

// matchingCrons lists the tenant's crons the request may use that match
// q's filters.
func (s *Server) matchingCrons(r *http.Request, tenant string, q *cronQuery) ([]*crons.Record, error) {
	all, err := s.crons.List(r.Context(), tenant)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, c := range all {
		switch {
		case !s.mayUseCron(r, c),
			q.AssistantID != "" && c.AssistantID != q.AssistantID,
			q.ThreadID != "" && (c.ThreadID == nil || *c.ThreadID != q.ThreadID),
			q.Enabled != nil && c.Enabled != *q.Enabled,
			!metadataMatches(c.Metadata, q.Metadata):
			continue
		}
		out = append(out, c)
	}
	return out, nil
}

// metadataMatches: every key of want is in have with an equal JSON value.
func metadataMatches(have, want map[string]any) bool {
	for k, v := range want {
		hv, ok := have[k]
		if !ok {
			return false
		}
		a, _ := json.Marshal(hv)
		b, _ := json.Marshal(v)
		var x, y any
		_ = json.Unmarshal(a, &x)
		_ = json.Unmarshal(b, &y)
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

// searchCrons: POST /runs/crons/search.
func (s *Server) searchCrons(w http.ResponseWriter, r *http.Request, tenant string) error {
	var q cronQuery
	if err := decodeBody(r, &q); err != nil {
		return err
	}
	limit := 10
	if q.Limit != nil {
		limit = *q.Limit
	}
	if limit < 1 || limit > 1000 || q.Offset < 0 {
		return errInvalid("limit", "limit must be 1 to 1000 and offset not negative")
	}
	list, err := s.matchingCrons(r, tenant, &q)
	if err != nil {
		return err
	}
	now := time.Now()
	views := make([]crons.Cron, len(list))
	for i, c := range list {
		views[i] = c.View(now)
	}
	cmp, err := listOrder(q.SortBy, q.SortOrder, "created_at", map[string]func(a, b *crons.Cron) int{
		"cron_id":      func(a, b *crons.Cron) int { return 0 },
		"assistant_id": func(a, b *crons.Cron) int { return strings.Compare(a.AssistantID, b.AssistantID) },
		"thread_id":    func(a, b *crons.Cron) int { return strings.Compare(deref(a.ThreadID), deref(b.ThreadID)) },
		"created_at":   func(a, b *crons.Cron) int { return a.CreatedAt.Compare(b.CreatedAt) },
		"updated_at":   func(a, b *crons.Cron) int { return a.UpdatedAt.Compare(b.UpdatedAt) },
		"next_run_date": func(a, b *crons.Cron) int {
			// A cron that will not run again sorts after every date.
			switch {
			case a.NextRunDate == nil && b.NextRunDate == nil:
				return 0
			case a.NextRunDate == nil:
				return 1
			case b.NextRunDate == nil:
				return -1
			}
			return a.NextRunDate.Compare(*b.NextRunDate)
		},
	}, func(c *crons.Cron) string { return c.CronID })
	if err != nil {
		return err
	}
	slices.SortStableFunc(views, func(a, b crons.Cron) int { return cmp(&a, &b) })
	if q.Offset >= len(views) {
		views = nil
	} else {
		views = views[q.Offset:min(len(views), q.Offset+limit)]
	}
	if len(q.Select) == 0 {
		writeJSON(w, http.StatusOK, orEmpty(views))
		return nil
	}
	out := make([]map[string]json.RawMessage, 0, len(views))
	for _, v := range views {
		b, _ := json.Marshal(v)
		var all map[string]json.RawMessage
		_ = json.Unmarshal(b, &all)
		m := map[string]json.RawMessage{}
		for _, f := range q.Select {
			if raw, ok := all[f]; ok {
				m[f] = raw
			} else {
				return errInvalid("select", fmt.Sprintf("%q is not a cron field", clip(f)))
			}
		}
		out = append(out, m)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// countCrons: POST /runs/crons/count.
func (s *Server) countCrons(w http.ResponseWriter, r *http.Request, tenant string) error {
	var q cronQuery
	if err := decodeBody(r, &q); err != nil {
		return err
	}
	list, err := s.matchingCrons(r, tenant, &q)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, len(list))
	return nil
}
