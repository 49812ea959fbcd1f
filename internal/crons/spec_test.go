package crons

import (
	"testing"
	"time"
)

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestSpecNextAndPrev(t *testing.T) {
	for _, c := range []struct {
		schedule, tz, from, next, prev string
	}{
		{"0 9 * * *", "", "2026-12-01T08:59:59Z", "2026-12-01T09:00:00Z", "2026-11-30T09:00:00Z"},
		{"0 9 * * *", "", "2026-12-01T09:00:00Z", "2026-12-02T09:00:00Z", "2026-12-01T09:00:00Z"},
		{"*/15 * * * *", "", "2026-12-01T10:07:30Z", "2026-12-01T10:15:00Z", "2026-12-01T10:00:00Z"},
		{"* * * * * *", "", "2026-12-01T10:07:30.4Z", "2026-12-01T10:07:31Z", "2026-12-01T10:07:30Z"},
		{"*/5 * * * * *", "", "2026-12-01T10:07:31Z", "2026-12-01T10:07:35Z", "2026-12-01T10:07:30Z"},
		// 9:00 in Paris is 8:00 UTC in winter.
		{"0 9 * * *", "Europe/Paris", "2026-12-01T07:00:00Z", "2026-12-01T08:00:00Z", "2026-11-30T08:00:00Z"},
		// Sunday as 7; 2026-12-06 is a Sunday.
		{"0 0 * * 7", "", "2026-12-01T00:00:00Z", "2026-12-06T00:00:00Z", "2026-11-29T00:00:00Z"},
		// Both day fields restricted: either matches (the 1st, or a Monday).
		{"0 0 1 * 1", "", "2026-12-02T00:00:00Z", "2026-12-07T00:00:00Z", "2026-12-01T00:00:00Z"},
		{"0 0 29 2 *", "", "2026-03-01T00:00:00Z", "2028-02-29T00:00:00Z", "2024-02-29T00:00:00Z"},
	} {
		s, err := Parse(c.schedule, c.tz)
		if err != nil {
			t.Fatalf("%s: %v", c.schedule, err)
		}
		from, _ := time.Parse(time.RFC3339Nano, c.from)
		next, err := s.Next(from)
		if err != nil || !next.Equal(at(c.next)) {
			t.Errorf("%s %s: next after %s is %s (%v), want %s", c.schedule, c.tz, c.from, next, err, c.next)
		}
		prev, err := s.Prev(from)
		if err != nil || !prev.Equal(at(c.prev)) {
			t.Errorf("%s %s: latest at or before %s is %s (%v), want %s", c.schedule, c.tz, c.from, prev, err, c.prev)
		}
	}
	if s, _ := Parse("0 9 * * *", ""); s.Pattern != "0 0 9 * * *" {
		t.Fatalf("5-field pattern becomes %q", s.Pattern)
	}
}

func TestSpecRefuses(t *testing.T) {
	for _, c := range [][2]string{
		{"", ""}, {"* * * *", ""}, {"61 * * * *", ""}, {"* 24 * * *", ""}, {"*/0 * * * *", ""},
		{"a * * * *", ""}, {"5-1 * * * *", ""}, {"* * * * * * *", ""}, {"* * * * *", "Mars/Base"}, {"* * * * *", "/etc/passwd"},
	} {
		if _, err := Parse(c[0], c[1]); err == nil {
			t.Errorf("%q %q was accepted", c[0], c[1])
		}
	}
	s, err := Parse("0 0 30 2 *", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Next(time.Now()); err == nil {
		t.Fatal("30 February has a next tick")
	}
}
