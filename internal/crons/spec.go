package crons

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Spec is a parsed schedule: LangGraph's 5-field cron (minute hour
// day-of-month month day-of-week) or natsagent's 6-field form with
// seconds first, interpreted in a time zone (UTC by default). Its
// Pattern is the 6-field form the jobs stream's message schedule fires
// on (Nats-Schedule), so the server and natsagent read the same ticks.
type Spec struct {
	Pattern string
	Loc     *time.Location
	fields  [6]uint64 // bit sets: second, minute, hour, day of month, month, day of week
	domAny  bool
	dowAny  bool
}

var bounds = [6][2]int{{0, 59}, {0, 59}, {0, 23}, {1, 31}, {1, 12}, {0, 6}}
var fieldNames = [6]string{"second", "minute", "hour", "day of month", "month", "day of week"}

// Parse reads a schedule and a time zone (an IANA name; "" is UTC).
func Parse(schedule, timezone string) (*Spec, error) {
	loc := time.UTC
	if timezone != "" {
		l, err := time.LoadLocation(timezone)
		if err != nil || strings.HasPrefix(timezone, "/") || strings.Contains(timezone, "..") {
			return nil, fmt.Errorf("timezone %q is not an IANA time zone name", timezone)
		}
		loc = l
	}
	parts := strings.Fields(schedule)
	switch len(parts) {
	case 5:
		parts = append([]string{"0"}, parts...)
	case 6:
	default:
		return nil, fmt.Errorf("schedule %q has %d fields; use 5 (minute hour day-of-month month day-of-week) or 6 (seconds first)", clip(schedule), len(parts))
	}
	s := &Spec{Pattern: strings.Join(parts, " "), Loc: loc}
	for i, p := range parts {
		set, err := parseField(p, bounds[i][0], bounds[i][1], i == 5)
		if err != nil {
			return nil, fmt.Errorf("schedule %q: %s field: %w", clip(schedule), fieldNames[i], err)
		}
		s.fields[i] = set
	}
	s.domAny = parts[3] == "*" || parts[3] == "?"
	s.dowAny = parts[5] == "*" || parts[5] == "?"
	return s, nil
}

func parseField(f string, lo, hi int, dow bool) (uint64, error) {
	var set uint64
	for _, item := range strings.Split(f, ",") {
		rng, stepS, hasStep := strings.Cut(item, "/")
		step := 1
		if hasStep {
			n, err := strconv.Atoi(stepS)
			if err != nil || n < 1 || n > hi {
				return 0, fmt.Errorf("step %q is not a number from 1 to %d", stepS, hi)
			}
			step = n
		}
		a, b := lo, hi
		switch {
		case rng == "*" || rng == "?":
		default:
			as, bs, isRange := strings.Cut(rng, "-")
			var err error
			if a, err = strconv.Atoi(as); err != nil {
				return 0, fmt.Errorf("%q is not a number, *, a range or a list", item)
			}
			b = a
			if isRange {
				if b, err = strconv.Atoi(bs); err != nil {
					return 0, fmt.Errorf("%q is not a range", item)
				}
			} else if hasStep {
				b = hi
			}
		}
		if dow && b == 7 {
			// 7 is Sunday too.
			set |= 1
			if a == 7 {
				continue
			}
			b = 6
		}
		if a < lo || b > hi || a > b {
			return 0, fmt.Errorf("%q is outside %d-%d", item, lo, hi)
		}
		for v := a; v <= b; v += step {
			set |= 1 << v
		}
	}
	return set, nil
}

func has(set uint64, v int) bool { return set&(1<<v) != 0 }

func (s *Spec) dayMatches(t time.Time) bool {
	if !has(s.fields[4], int(t.Month())) {
		return false
	}
	dom, dow := has(s.fields[3], t.Day()), has(s.fields[5], int(t.Weekday()))
	switch {
	case s.domAny && s.dowAny:
		return true
	case s.domAny:
		return dow
	case s.dowAny:
		return dom
	default:
		return dom || dow // cron's rule when both are restricted
	}
}

// searchDays bounds a search (a schedule that never matches, such as
// 30 February, ends it).
const searchDays = 5 * 366

var errNever = errors.New("the schedule never fires")

// Next is the first tick strictly after t.
func (s *Spec) Next(t time.Time) (time.Time, error) {
	t = t.In(s.Loc).Truncate(time.Second).Add(time.Second)
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, s.Loc)
	for range searchDays {
		if s.dayMatches(day) {
			for h := 0; h < 24; h++ {
				if !has(s.fields[2], h) {
					continue
				}
				for m := 0; m < 60; m++ {
					if !has(s.fields[1], m) {
						continue
					}
					for sec := 0; sec < 60; sec++ {
						if !has(s.fields[0], sec) {
							continue
						}
						c := time.Date(day.Year(), day.Month(), day.Day(), h, m, sec, 0, s.Loc)
						if !c.Before(t) && c.Hour() == h {
							return c.UTC(), nil
						}
					}
				}
			}
		}
		day = time.Date(day.Year(), day.Month(), day.Day()+1, 0, 0, 0, 0, s.Loc)
	}
	return time.Time{}, errNever
}

// Prev is the latest tick at or before t.
func (s *Spec) Prev(t time.Time) (time.Time, error) {
	t = t.In(s.Loc).Truncate(time.Second)
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, s.Loc)
	for range searchDays {
		if s.dayMatches(day) {
			for h := 23; h >= 0; h-- {
				if !has(s.fields[2], h) {
					continue
				}
				for m := 59; m >= 0; m-- {
					if !has(s.fields[1], m) {
						continue
					}
					for sec := 59; sec >= 0; sec-- {
						if !has(s.fields[0], sec) {
							continue
						}
						c := time.Date(day.Year(), day.Month(), day.Day(), h, m, sec, 0, s.Loc)
						if !c.After(t) && c.Hour() == h {
							return c.UTC(), nil
						}
					}
				}
			}
		}
		day = time.Date(day.Year(), day.Month(), day.Day()-1, 0, 0, 0, 0, s.Loc)
	}
	return time.Time{}, errNever
}

func clip(s string) string {
	if len(s) <= 60 {
		return s
	}
	return s[:60] + "..."
}
