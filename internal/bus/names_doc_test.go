package bus

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/doctest"
	"github.com/natsagent/natsagent/internal/protocol"
)

// docs/protocol.md's table of names (1.2) shows each name with the default
// prefix; those are exactly the names Names makes for the same tenant,
// thread and run.
func TestProtocolNamesTable(t *testing.T) {
	section := doctest.Section(t, "docs/protocol.md", "### 1.2 Prefix and derived names")
	var documented []string
	code := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(strings.ReplaceAll(line, `\|`, "/"), "|")
		if len(cells) != 5 || !strings.HasPrefix(line, "| ") {
			continue
		}
		for _, m := range code.FindAllStringSubmatch(cells[3], -1) {
			documented = append(documented, m[1])
		}
	}

	n := DefaultNames()
	made := []string{
		n.RunsStream(), n.EventsStream(), n.DLQStream(), RunsConsumer,
		n.RunsBucket(), n.ThreadsBucket(), n.CheckpointsBucket(), n.UsageBucket(), n.FilesBucket(),
		n.RunSubject("default", "demo"),
		n.EventSubject("default", "demo", "r4", protocol.KindLifecycle),
		n.LiveSubject("default", "demo", "r4", protocol.KindMessages),
		n.CancelSubject("default", "demo", "r4"),
		n.ThreadDeleteSubject("default", "demo"),
		n.RunDeleteSubject("default", "demo", "r4"),
		n.DLQSubject("default", "demo"),
		n.ToolSubject("default", "convert_temperature"),
		n.ToolsRefreshSubject(),
		n.SubagentSubject("default", "start"),
		n.JobSubject("compact", "default", "demo"),
	}
	slices.Sort(documented)
	slices.Sort(made)
	if !slices.Equal(documented, made) {
		t.Errorf("docs/protocol.md 1.2 shows\n  %s\nNames makes\n  %s", strings.Join(documented, "\n  "), strings.Join(made, "\n  "))
	}
}
