package erase_test

import (
	"context"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/natsagent/natsagent/internal/crons"
	"github.com/natsagent/natsagent/internal/erase"
)

// Deleting a thread deletes its crons; erasing a user deletes the crons
// they created; others' and other tenants' crons stay. A deleted cron's
// schedule is purged.
func TestEraseRemovesCrons(t *testing.T) {
	e := setup(t)
	ctx := context.Background()
	e.seed(t, "acme", "h1", "bob")
	store, err := crons.Open(ctx, e.js, e.names)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(tenant, id, owner, thread string) {
		r := &crons.Record{Tenant: tenant, Owner: owner}
		r.CronID, r.AssistantID, r.Schedule, r.Enabled = id, "chatbot", "0 9 * * *", true
		if thread != "" {
			r.ThreadID = &thread
		}
		if _, err := store.Put(ctx, r, 0); err != nil {
			t.Fatal(err)
		}
		if err := store.Schedule(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	mk("acme", "c1", "bob", "h1")
	mk("acme", "c2", "alice", "")
	mk("acme", "c3", "bob", "")
	mk("globex", "c4", "alice", "")
	exists := func(tenant, id string) bool {
		_, _, recErr := store.GetLatest(ctx, tenant, id)
		if recErr != nil && !errors.Is(recErr, crons.ErrNotFound) {
			t.Fatal(recErr)
		}
		st, _ := e.js.Stream(ctx, e.names.JobsStream())
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(e.names.JobScheduleSubject(crons.JobKind, tenant, id)))
		if err != nil {
			t.Fatal(err)
		}
		if (recErr == nil) != (len(info.State.Subjects) == 1) {
			t.Fatalf("cron %s/%s: record and schedule disagree", tenant, id)
		}
		return len(info.State.Subjects) == 1
	}
	if err := e.eraser.DeleteThread(ctx, "acme", "h1", erase.ThreadOptions{}); err != nil {
		t.Fatal(err)
	}
	if exists("acme", "c1") {
		t.Fatal("the deleted thread's cron is still there")
	}
	if !exists("acme", "c2") || !exists("acme", "c3") {
		t.Fatal("deleting a thread removed other crons")
	}
	if _, err := e.eraser.EraseUser(ctx, "acme", "alice", erase.ThreadOptions{}); err != nil {
		t.Fatal(err)
	}
	if exists("acme", "c2") {
		t.Fatal("the erased user's cron is still there")
	}
	if !exists("acme", "c3") || !exists("globex", "c4") {
		t.Fatal("erasing a user removed another user's or tenant's cron")
	}
}
