package main

import (
	"fmt"
	"io"
)

// examples are the example lines each command's help ends with, keyed by
// the command's name as its usage line spells it.
var examples = map[string][]string{
	"run": {
		`natsagent run --thread demo "What time is it?"`,
		`natsagent run --detach --thread demo "Count slowly"     # prints the run id only`,
		`echo "Summarize README.md" | natsagent run --agent researcher`,
	},
	"tail": {
		"natsagent tail --run r3",
		"natsagent tail --thread demo --from-start --json",
	},
	"steer":   {`natsagent steer --thread demo "Stop, count to three instead"`},
	"cancel":  {"natsagent cancel --run r3", "natsagent cancel --thread demo            # the thread's active run"},
	"approve": {"natsagent approve --thread demo", "natsagent approve --thread demo --list", `natsagent approve --thread demo 1 --message "only the first"`},
	"reject":  {`natsagent reject --thread demo "not that file"`},
	"answer":  {`natsagent answer --thread demo "Lyon"`},
	"runs":    {"natsagent runs --thread demo", "natsagent runs --thread demo --json"},
	"threads": {"natsagent threads", "natsagent threads --json"},
	"usage":   {"natsagent usage --run r3", "natsagent usage --thread demo --json"},
	"compact": {"natsagent compact --thread demo"},
	"soak": {
		"natsagent soak --runs 300 --faults worker,model",
		"natsagent soak --cluster --faults node,worker,model --duration 5m --json",
	},
	"bench": {
		"natsagent bench",
		"natsagent bench --json",
		"natsagent bench --scenarios burst,latency --model http --model-latency 50ms",
	},
	"threads delete": {"natsagent threads delete demo", "natsagent threads delete demo --cancel"},
	"runs delete":    {"natsagent runs delete --thread demo --run r3"},
	"users erase":    {"natsagent users erase --tenant acme --user alice"},
	"tenant": {
		"natsagent tenant add acme --conf deploy/nats/tenants.conf",
		"natsagent tenant list --conf deploy/nats/tenants.conf",
	},
	"jwt":               {"natsagent jwt init --dir ./natsjwt", "natsagent jwt tenant-add --dir ./natsjwt --tenant acme --user alice"},
	"jwt init":          {"natsagent jwt init --dir ./natsjwt"},
	"jwt tenant-add":    {"natsagent jwt tenant-add --dir ./natsjwt --tenant acme --user alice --server nats://127.0.0.1:4222"},
	"jwt user-add":      {"natsagent jwt user-add --dir ./natsjwt --account acme --user bob --server nats://127.0.0.1:4222"},
	"jwt user-rotate":   {"natsagent jwt user-rotate --dir ./natsjwt --account acme --user bob --server nats://127.0.0.1:4222"},
	"jwt user-revoke":   {"natsagent jwt user-revoke --dir ./natsjwt --account acme --user bob --server nats://127.0.0.1:4222"},
	"jwt tenant-remove": {"natsagent jwt tenant-remove --dir ./natsjwt --tenant acme --server nats://127.0.0.1:4222"},
	"jwt server-config": {"natsagent jwt server-config --dir ./natsjwt --resolver-dir /data/jwt --out operator.conf"},
	"jwt push":          {"natsagent jwt push --dir ./natsjwt --server nats://n1:4222,nats://n2:4222"},
}

// writeExamples prints a command's examples, if it has any.
func writeExamples(w io.Writer, name string) {
	lines := examples[name]
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Examples:")
	for _, l := range lines {
		fmt.Fprintln(w, "  "+l)
	}
}
