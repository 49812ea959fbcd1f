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
