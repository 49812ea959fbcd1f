package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/natsagent/natsagent"
	"github.com/natsagent/natsagent/internal/protocol"
)

func runUsage(ctx context.Context, args []string, std stdio) error {
	fs := newFlagSet("usage", "--run <run> | --thread <thread> [flags]", `
Shows token usage from the deployment's usage bucket: a run's (its own model calls, its
subagents', the total; by purpose and by model), or a thread's (the sum of its ended runs, with
each run's total). A run's figures are written when it ends; before that they are zero and not
final. --json prints the stored record.`, std)
	f := addClientFlags(fs)
	run := fs.String("run", "", "the run")
	thread := fs.String("thread", "", "the thread")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return parseErr(err)
	}
	if len(pos) > 0 {
		return usageErr(std, "usage", "unexpected argument %q: name the run with --run or the thread with --thread", pos[0])
	}
	if (*run == "") == (*thread == "") {
		return usageErr(std, "usage", "name either the run (--run) or the thread (--thread)")
	}
	c, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	if *run != "" {
		u, err := c.runUsage(ctx, *run)
		if err != nil {
			return err
		}
		if f.json {
			return writeJSON(std.out, u)
		}
		state := "final"
		if !u.Final {
			state = "not final: the run has not ended"
		}
		fmt.Fprintf(std.out, "run %s on thread %s (%s)\n", u.RunID, u.ThreadID, state)
		rows := []usageRow{{"total", u.Total.TokenCounts}, {"  main", u.Total.Main}, {"  summary", u.Total.Summary}}
		if len(u.Children) > 0 {
			rows = append(rows, usageRow{"own calls", u.Own.TokenCounts})
			for _, id := range sortedKeys(u.Children) {
				rows = append(rows, usageRow{"subagent " + id, u.Children[id].TokenCounts})
			}
		}
		return usageTable(std.out, rows, u.Total)
	}
	u, err := c.threadUsage(ctx, *thread)
	if err != nil {
		return err
	}
	if f.json {
		return writeJSON(std.out, u)
	}
	fmt.Fprintf(std.out, "thread %s: %s ended with usage\n", u.ThreadID, plural(len(u.Runs)+u.FoldedRuns, "run"))
	rows := []usageRow{{"total", u.Total.TokenCounts}, {"  main", u.Total.Main}, {"  summary", u.Total.Summary}}
	// Newest applied first.
	ids := sortedKeys(u.Runs)
	sort.SliceStable(ids, func(i, j int) bool { return u.Runs[ids[i]].Seq > u.Runs[ids[j]].Seq })
	for _, id := range ids {
		rows = append(rows, usageRow{"run " + id, u.Runs[id].Usage.TokenCounts})
	}
	if u.FoldedRuns > 0 {
		rows = append(rows, usageRow{fmt.Sprintf("%s before", plural(u.FoldedRuns, "older run")), u.Folded.TokenCounts})
	}
	return usageTable(std.out, rows, u.Total)
}

// runUsage reads a run's usage: its record's figures (the usage bucket
// for a run that ended before protocol v2), else zero, as the gateway
// answers.
func (c *client) runUsage(ctx context.Context, run string) (*protocol.RunUsage, error) {
	u, err := c.api.RunUsage(ctx, run)
	if errors.Is(err, natsagent.ErrNotFound) {
		// Say it as the other commands do, with how to find the id.
		if _, nerr := c.run(ctx, "", run); nerr != nil {
			return nil, nerr
		}
	}
	if err != nil {
		return nil, fmt.Errorf("read the usage of run %s: %w", run, err)
	}
	return u, nil
}

// threadUsage reads a thread's usage: its record's totals plus the usage
// bucket's from before protocol v2; zero before its first run ended.
func (c *client) threadUsage(ctx context.Context, thread string) (*protocol.ThreadUsage, error) {
	u, err := c.api.ThreadUsage(ctx, thread)
	if errors.Is(err, natsagent.ErrNotFound) {
		// Say it as the other commands do, with how to find the id.
		if _, nerr := c.thread(ctx, thread); nerr != nil {
			return nil, nerr
		}
	}
	if err != nil {
		return nil, fmt.Errorf("read the usage of thread %s: %w", thread, err)
	}
	return u, nil
}

type usageRow struct {
	label string
	t     protocol.TokenCounts
}

// usageTable prints token counts, then the split by model: labels
// aligned left, numbers right.
func usageTable(w io.Writer, rows []usageRow, total protocol.UsageTotals) error {
	table := [][]string{{"", "calls", "input", "output", "total", "cached"}}
	add := func(label string, t protocol.TokenCounts) {
		cached := "-"
		if t.Cached != nil {
			cached = count(*t.Cached)
		}
		table = append(table, []string{label, count(t.Calls), count(t.Input), count(t.Output), count(t.Total), cached})
	}
	for _, r := range rows {
		add(r.label, r.t)
	}
	if len(total.Models) > 0 {
		table = append(table, []string{"by model:"})
		for _, name := range sortedKeys(total.Models) {
			m := total.Models[name]
			var all protocol.TokenCounts
			all.Add(m.Main)
			all.Add(m.Summary)
			add("  "+orDefault(name, "(unnamed)"), all)
		}
	}
	widths := make([]int, len(table[0]))
	for _, row := range table {
		for i, cell := range row {
			if row[0] == "by model:" {
				break
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	var b strings.Builder
	for _, row := range table {
		for i, cell := range row {
			pad := strings.Repeat(" ", max(widths[i]-utf8.RuneCountInString(cell), 0))
			switch {
			case i == 0 && len(row) == 1:
				b.WriteString(cell)
			case i == 0:
				b.WriteString(cell + pad)
			default:
				b.WriteString("  " + pad + cell)
			}
		}
		b.WriteByte('\n')
	}
	if total.ApproximateCalls > 0 {
		fmt.Fprintf(&b, "%d of %s are estimates: the provider reported no usage for them\n", total.ApproximateCalls, plural(total.Calls, "call"))
	}
	_, err := io.WriteString(w, b.String())
	return err
}
