package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// Units of a row's value.
const (
	unitRunsPerSec = "runs/s"
	unitMsgPerSec  = "msg/s"
	unitMillis     = "ms"
	unitMicros     = "µs"
	unitBytes      = "B"
	unitKiB        = "KiB"
	unitTimes      = "x"
	unitCount      = "count"
	// unitMsgs is a count of messages per unit of work (a run, a
	// sample), with decimals.
	unitMsgs = "msgs"
)

// Row is one measured figure. Baseline is the comparable figure of the raw
// JetStream baseline (or of the reference configuration, such as one
// worker process), and Ratio is Value / Baseline.
type Row struct {
	Scenario     string   `json:"scenario"`
	Key          string   `json:"key"`
	Metric       string   `json:"metric"`
	Value        float64  `json:"value"`
	Unit         string   `json:"unit"`
	Baseline     *float64 `json:"baseline,omitempty"`
	BaselineUnit string   `json:"baseline_unit,omitempty"`
	Ratio        *float64 `json:"ratio,omitempty"`
	Target       string   `json:"target,omitempty"`
	OK           *bool    `json:"ok,omitempty"`
	// Breakdown splits Value into its parts (stored messages by asset).
	Breakdown map[string]float64 `json:"breakdown,omitempty"`
}

// withBaseline sets the baseline and the ratio value / baseline.
func (r Row) withBaseline(b float64, unit string) Row {
	r.Baseline, r.BaselineUnit = &b, unit
	if b != 0 {
		ratio := r.Value / b
		r.Ratio = &ratio
	}
	return r
}

// atMost marks the row ok when its value is ≤ limit.
func (r Row) atMost(limit float64, text string) Row {
	ok := r.Value <= limit
	r.OK, r.Target = &ok, text
	return r
}

// ratioAtMost marks the row ok when its ratio to the baseline is ≤
// limit (withBaseline first).
func (r Row) ratioAtMost(limit float64, text string) Row {
	ok := r.Ratio != nil && *r.Ratio <= limit
	r.OK, r.Target = &ok, text
	return r
}

// atLeast marks the row ok when its value is ≥ limit.
func (r Row) atLeast(limit float64, text string) Row {
	ok := r.Value >= limit
	r.OK, r.Target = &ok, text
	return r
}

// ScenarioResult says how one scenario went, beside its rows.
type ScenarioResult struct {
	Name      string   `json:"name"`
	Seconds   float64  `json:"seconds"`
	Budget    float64  `json:"budget_seconds"`
	OutOfTime bool     `json:"out_of_time,omitempty"`
	Error     string   `json:"error,omitempty"`
	Notes     []string `json:"notes,omitempty"`
}

// Host describes the machine the bench ran on.
type Host struct {
	OS         string `json:"os"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Go         string `json:"go"`
}

// Report is the result of one bench invocation.
type Report struct {
	Started   time.Time        `json:"started"`
	Seconds   float64          `json:"seconds"`
	Host      Host             `json:"host"`
	Server    string           `json:"server"`
	Model     string           `json:"model"`
	Prefix    string           `json:"prefix"`
	Settings  map[string]any   `json:"settings"`
	Rows      []Row            `json:"rows"`
	Scenarios []ScenarioResult `json:"scenarios"`
}

// Failed lists the rows that missed their target.
func (r *Report) Failed() []Row {
	var out []Row
	for _, row := range r.Rows {
		if row.OK != nil && !*row.OK {
			out = append(out, row)
		}
	}
	return out
}

func (r *Report) targets() int {
	n := 0
	for _, row := range r.Rows {
		if row.OK != nil {
			n++
		}
	}
	return n
}

// WriteJSON writes the report as one indented JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report for people: a header, one line per row,
// then the notes of every scenario.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "natsagent bench: %s, %d CPUs (GOMAXPROCS %d), %s\n", r.Host.OS, r.Host.CPUs, r.Host.GOMAXPROCS, r.Host.Go)
	fmt.Fprintf(w, "server: %s; model: %s; prefix: %s; %.1fs\n\n", r.Server, r.Model, r.Prefix, r.Seconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tmetric\tvalue\tbaseline\tratio\ttarget\tok")
	last := ""
	for _, row := range r.Rows {
		scenario := row.Scenario
		if scenario == last {
			scenario = ""
		}
		last = row.Scenario
		baseline, ratio, ok := "", "", ""
		if row.Baseline != nil {
			unit := row.BaselineUnit
			if unit == "" {
				unit = row.Unit
			}
			baseline = formatValue(*row.Baseline, unit)
		}
		if row.Ratio != nil {
			ratio = formatRatio(*row.Ratio)
		}
		if row.OK != nil {
			ok = "✓"
			if !*row.OK {
				ok = "✗"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", scenario, row.Metric, formatValue(row.Value, row.Unit), baseline, ratio, row.Target, ok)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var notes []string
	for _, s := range r.Scenarios {
		head := fmt.Sprintf("%s (%.1fs of a %.0fs budget)", s.Name, s.Seconds, s.Budget)
		if s.OutOfTime {
			notes = append(notes, head+": ran out of time; the figures cover what was measured until then")
		}
		if s.Error != "" {
			notes = append(notes, head+": "+s.Error)
		}
		for _, n := range s.Notes {
			notes = append(notes, s.Name+": "+n)
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range notes {
			fmt.Fprintln(w, "- "+n)
		}
	}
	if failed := r.Failed(); len(failed) > 0 {
		fmt.Fprintf(w, "\n%d of %d targets missed.\n", len(failed), r.targets())
	}
	return nil
}

func formatRatio(x float64) string {
	switch {
	case x == 0:
		return "0"
	case x < 0.01:
		return fmt.Sprintf("%.4f", x)
	case x < 10:
		return fmt.Sprintf("%.2f", x)
	default:
		return fmt.Sprintf("%.1f", x)
	}
}

func formatValue(v float64, unit string) string {
	switch unit {
	case unitRunsPerSec, unitMsgPerSec:
		if v < 100 {
			return fmt.Sprintf("%.1f %s", v, unit)
		}
		return group(v) + " " + unit
	case unitMillis:
		switch {
		case v < 10:
			return fmt.Sprintf("%.2f ms", v)
		case v < 1000:
			return fmt.Sprintf("%.1f ms", v)
		default:
			return group(v) + " ms"
		}
	case unitMicros:
		if v < 1000 {
			return fmt.Sprintf("%.1f µs", v)
		}
		return group(v) + " µs"
	case unitBytes:
		return group(v) + " B"
	case unitKiB:
		if v >= 10*1024 {
			return fmt.Sprintf("%.1f MiB", v/1024)
		}
		return fmt.Sprintf("%.1f KiB", v)
	case unitTimes:
		return formatRatio(v) + "×"
	case unitCount, "":
		return group(v)
	case unitMsgs:
		return formatPerRun(v)
	}
	return fmt.Sprintf("%.2f %s", v, unit)
}

// formatPerRun shows a per-run count with two decimals: 16.00 messages a
// run, 0.05 of a dead-letter.
func formatPerRun(v float64) string { return fmt.Sprintf("%.2f", v) }

// group formats v rounded to an integer with thousands separators.
func group(v float64) string {
	n := int64(math.Round(v))
	sign := ""
	if n < 0 {
		sign, n = "-", -n
	}
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return sign + b.String()
}
