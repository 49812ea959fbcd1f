package bus

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/natsagent/natsagent/internal/protocol"
)

// kvKey is the key rule of nats.go's jetstream KV (keyValid): what a Put
// with a key outside it fails with.
var kvKey = regexp.MustCompile(`^[-/_=\.a-zA-Z0-9]+$`)

func validKVKey(k string) bool {
	return k != "" && k[0] != '.' && k[len(k)-1] != '.' && !strings.Contains(k, "..") && kvKey.MatchString(k)
}

// FuzzSubjectTokens: an id protocol.ValidToken accepts can never change
// the shape of a subject or a key built from it. Every subject natsagent
// builds from accepted ids has exactly its tokens (no extra '.', no
// wildcard, no whitespace, no empty token), is a valid publish subject
// for the server, falls under its stream's filter, and parses back to the
// same ids; every key is a valid KV key. Parsing goes the other way too:
// a subject a parser accepts is exactly the one its builder makes.
func FuzzSubjectTokens(f *testing.F) {
	seeds := [][5]string{
		{"agent", "default", "t1", "r1", "k1"},
		{"x", "A-b_9", strings.Repeat("z", 128), "-", "_"},
		{"agent", "a.b", "t1", "r1", "k"},
		{"agent", "a", "*", ">", "k"},
		{"agent", "a b", "t\t1", "r\n", "k"},
		{"agent", "", "t1", "r1", "k"},
		{"agent", "ü", "t1", "r1", "k"},
		{"agent", "a\x00", "t1", "r1", "k"},
		{"agent", strings.Repeat("z", 129), "t1", "r1", "k"},
		{"a.b", "t", "h", "r", "k"},
		{"", "t", "h", "r", "k"},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1], s[2], s[3], s[4])
	}
	f.Fuzz(func(t *testing.T, prefix, tenant, thread, run, other string) {
		for _, s := range []string{tenant, thread, run, other} {
			if !protocol.ValidToken(s) {
				continue
			}
			if s == "" || len(s) > protocol.MaxTokenLen || strings.ContainsAny(s, ".*> \t\r\n\f\x00/\\") {
				t.Fatalf("ValidToken accepted %q", s)
			}
			for _, r := range s {
				if r >= 0x80 {
					t.Fatalf("ValidToken accepted non-ASCII %q", s)
				}
			}
		}
		n, err := NewNames(prefix)
		if err != nil {
			return
		}
		p := n.Prefix
		if !protocol.ValidToken(p) {
			t.Fatalf("NewNames accepted prefix %q", p)
		}
		// The parsers, on any subject: what they accept is what the
		// builder of those tokens makes.
		for _, subj := range []string{tenant, p + ".runs." + tenant, p + ".ctl." + tenant} {
			if te, th, ok := n.ParseRunSubject(subj); ok && n.RunSubject(te, th) != subj {
				t.Fatalf("ParseRunSubject(%q) = %q %q", subj, te, th)
			}
			if te, th, r, ok := n.ParseCancelSubject(subj); ok && n.CancelSubject(te, th, r) != subj {
				t.Fatalf("ParseCancelSubject(%q) = %q %q %q", subj, te, th, r)
			}
		}
		if !protocol.ValidToken(tenant) || !protocol.ValidToken(thread) || !protocol.ValidToken(run) || !protocol.ValidToken(other) {
			return
		}
		check := func(subject, filter string, want ...string) {
			t.Helper()
			if got := strings.Split(subject, "."); !slices.Equal(got, want) {
				t.Fatalf("subject %q has tokens %q, want %q", subject, got, want)
			}
			if !server.IsValidPublishSubject(subject) {
				t.Fatalf("subject %q is not a valid publish subject", subject)
			}
			if filter != "" && !server.SubjectMatchesFilter(subject, filter) {
				t.Fatalf("subject %q is not under its filter %q", subject, filter)
			}
		}
		check(n.RunSubject(tenant, thread), n.RunsSubjects(), p, "runs", tenant, thread)
		check(n.EventSubject(tenant, thread, run, other), n.EventsSubjects(), p, "events", tenant, thread, run, other)
		check(n.CancelSubject(tenant, thread, run), n.CancelSubjects(), p, "ctl", tenant, thread, run, "cancel")
		check(n.DLQSubject(tenant, thread), n.DLQSubjects(), p, "dlq", "runs", tenant, thread)
		check(n.WorkerControl(other), "", p, "worker", other, "ctl")
		check(n.JobSubject(other, tenant, run), n.JobsSubjects(), p, "jobs", other, tenant, run)
		check(n.JobScheduleSubject(other, tenant), n.JobSchedulesSubjects(), p, "schedules", "jobs", other, tenant)
		check(n.DLQJobSubject(other), n.DLQSubjects(), p, "dlq", "jobs", other)
		for _, filter := range []string{n.RunEvents(tenant, thread, run), n.ThreadEvents(tenant, thread), n.ThreadLifecycle(tenant, thread)} {
			if !server.IsValidSubject(filter) || !server.SubjectMatchesFilter(n.EventSubject(tenant, thread, run, protocol.KindLifecycle), filter) {
				t.Fatalf("filter %q does not match the run's lifecycle subject", filter)
			}
		}
		if other != run && server.SubjectMatchesFilter(n.EventSubject(tenant, thread, other, protocol.KindLifecycle), n.RunEvents(tenant, thread, run)) {
			t.Fatalf("run %q's filter matches run %q", run, other)
		}

		if te, th, ok := n.ParseRunSubject(n.RunSubject(tenant, thread)); !ok || te != tenant || th != thread {
			t.Fatalf("run subject of %q %q parses as %q %q %v", tenant, thread, te, th, ok)
		}
		if te, th, r, ok := n.ParseCancelSubject(n.CancelSubject(tenant, thread, run)); !ok || te != tenant || th != thread || r != run {
			t.Fatalf("cancel subject parses as %q %q %q %v", te, th, r, ok)
		}

		for _, key := range []string{Key(tenant, run), Key(tenant, thread), Key(tenant, thread, run)} {
			if !validKVKey(key) {
				t.Fatalf("key %q is not a valid KV key", key)
			}
		}
		if got := strings.Split(Key(tenant, run), "."); !slices.Equal(got, []string{tenant, run}) {
			t.Fatalf("key of %q %q has tokens %q", tenant, run, got)
		}
		for _, name := range []string{n.RunsBucket(), n.ThreadsBucket(), n.CheckpointsBucket(), n.UsageBucket(), n.FilesBucket(), n.MemoryBucket(), n.CronsBucket(), n.StoreBucket(),
			n.RunsStream(), n.EventsStream(), n.DLQStream(), n.JobsStream()} {
			if !protocol.ValidToken(name) {
				t.Fatalf("asset name %q is not a plain name", name)
			}
		}
	})
}
