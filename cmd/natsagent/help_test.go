package main

import (
	"strings"
	"testing"
)

// Every command's -h says what it does (a description beyond the usage
// line), its arguments (the usage line), its flags (or, for a group, its
// commands) and an example of itself, and exits 0.
func TestEveryCommandHasARealHelp(t *testing.T) {
	var helps [][]string
	for _, c := range commands() {
		if c.hidden || c.run == nil {
			continue
		}
		helps = append(helps, []string{c.name, "-h"})
	}
	helps = append(helps, []string{"threads", "delete", "-h"}, []string{"runs", "delete", "-h"}, []string{"users", "erase", "-h"},
		[]string{"tenant", "add", "-h"}, []string{"tenant", "list", "-h"}, []string{"jwt", "init", "-h"})
	for _, c := range jwtCommands() {
		helps = append(helps, []string{"jwt", c.name, "-h"})
	}
	for _, args := range helps {
		name := strings.Join(args[:len(args)-1], " ")
		code, out, errOut := runCLI(args...)
		text := out + errOut
		if code != 0 {
			t.Errorf("%s -h: exit %d\n%s", name, code, text)
			continue
		}
		usage, rest, ok := strings.Cut(text, "\n")
		if !ok || !strings.HasPrefix(usage, "Usage: natsagent "+args[0]) {
			t.Errorf("%s -h: no usage line first:\n%s", name, text)
			continue
		}
		about, _, _ := strings.Cut(rest, "Examples:")
		if len(strings.Fields(about)) < 8 {
			t.Errorf("%s -h: no description of what it does:\n%s", name, text)
		}
		_, ex, ok := strings.Cut(text, "Examples:\n")
		if !ok || !strings.HasPrefix(strings.TrimSpace(ex), "natsagent "+args[0]) {
			t.Errorf("%s -h: no example of itself:\n%s", name, text)
		}
		// A group (jwt, tenant) lists its commands, whose help has the flags.
		if !strings.Contains(text, "Flags:") && !strings.Contains(text, "Commands:") && !strings.Contains(usage, "--") {
			t.Errorf("%s -h: no flags:\n%s", name, text)
		}
	}
}

// `natsagent help <command> <subcommand>` shows the subcommand's help, as
// `natsagent <command> <subcommand> -h` does (README, "Command line").
func TestHelpOfASubcommand(t *testing.T) {
	for _, args := range [][]string{{"runs", "delete"}, {"threads", "delete"}, {"users", "erase"}, {"tenant", "list"}, {"jwt", "init"}} {
		name := strings.Join(args, " ")
		code, out, errOut := runCLI(append([]string{"help"}, args...)...)
		if code != 0 {
			t.Errorf("help %s: exit %d\n%s%s", name, code, out, errOut)
			continue
		}
		_, wantOut, wantErr := runCLI(append(args, "-h")...)
		if got, want := out+errOut, wantOut+wantErr; !strings.Contains(got, "natsagent "+name) || got != want {
			t.Errorf("help %s printed:\n%s\nwant what %s -h prints:\n%s", name, got, name, want)
		}
	}
}
