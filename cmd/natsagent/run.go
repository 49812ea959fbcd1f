package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/natsagent/natsagent"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// runFlags are the flags of the commands that submit a run and follow it.
type runFlags struct {
	*clientFlags
	detach bool
	runID  string
	modes  *modesFlag
}

func addRunFlags(fs *flag.FlagSet) *runFlags {
	f := &runFlags{clientFlags: addClientFlags(fs)}
	fs.BoolVar(&f.detach, "detach", false, "only submit: print the run id (the run record with --json) and exit")
	f.modes = addModesFlag(fs)
	fs.StringVar(&f.runID, "run-id", "", "the run's id (default: a new random one); submitting the same id again follows the existing run instead of starting another")
	return f
}

func runRun(ctx context.Context, args []string, std stdio) error {
	fs := newFlagSet("run", "[flags] [message…]", `
Submits a run and streams its answer as it arrives: text as the model writes it, each tool call as
"▸ name(args)" with its result status under it, and a final line with the run's status and stop
reason. The message is the arguments joined by spaces, or stdin when there are none (or "-").

With --stream-mode the run is printed as the gateway streams it to a LangGraph client (its SSE
events, or one {"event","data"} line each with --json) instead.

The exit status is 1 when the run ends error, cancelled, timeout or rejected, 3 when a guard cut it
short (incomplete: max_steps, loop or budget caps; the answer so far is printed), 0 when it
succeeds, waits for a person (interrupted) or was steered. Ctrl-C detaches and leaves the run going; the
command prints how to follow it again (natsagent tail) or cancel it.`, std)
	f := addRunFlags(fs)
	thread := fs.String("thread", "", "thread to run on (default: a new thread)")
	agentName := fs.String("agent", "", "agent profile (default: the deployment's default, chatbot)")
	strategy := fs.String("strategy", protocol.StrategyEnqueue, "what to do when the thread is busy: enqueue, reject, steer or rollback")
	modelName := fs.String("model", "", "model for this run (default: the agent's)")
	maxSteps := fs.Int("max-steps", 0, "most model calls of this run (default: the agent's)")
	approval := fs.String("approval-mode", "", "tool approval: default (ask before sensitive tools) or always_trust")
	timeout := fs.Duration("timeout", 0, "wall-time bound of the run, ended timeout beyond it (default: the worker's)")
	var images imagesFlag
	fs.Var(&images, "image", "an image file (PNG, JPEG, GIF or WebP) sent with the message; repeat for more")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return parseErr(err)
	}
	if *thread == "" {
		*thread = newID()
	} else if err := protocol.CheckToken("--thread", *thread); err != nil {
		return usageErr(std, "run", "%v", err)
	}
	if *agentName != "" {
		if err := protocol.CheckToken("--agent", *agentName); err != nil {
			return usageErr(std, "run", "%v", err)
		}
	}
	text, err := message(pos, std)
	if err != nil {
		return usageErr(std, "run", "%v", err)
	}
	req := &protocol.RunRequest{
		ThreadID:          *thread,
		Agent:             *agentName,
		MultitaskStrategy: *strategy,
		Input:             &protocol.Input{Messages: []model.Message{{Role: model.RoleUser, Content: text}}},
		Config: protocol.RunConfig{
			Model: *modelName, MaxSteps: *maxSteps, ToolApprovalMode: *approval,
			TimeoutSeconds: int((*timeout + time.Second - 1) / time.Second),
		},
	}
	var imgs [][]byte
	for _, name := range images {
		data, err := os.ReadFile(name)
		if err != nil {
			return usageErr(std, "run", "--image: %v", err)
		}
		imgs = append(imgs, data)
	}
	c, err := f.connect(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	if len(imgs) > 0 {
		in, err := c.api.ImageInput(ctx, req.ThreadID, text, imgs...)
		if err != nil {
			return fmt.Errorf("--image: %w", err)
		}
		req.Input.Messages = in.Messages
	}
	return launch(ctx, c, std, f, req)
}

// imagesFlag is --image, repeated.
type imagesFlag []string

func (f *imagesFlag) String() string { return strings.Join(*f, ",") }

func (f *imagesFlag) Set(v string) error {
	*f = append(*f, v)
	return nil
}

// message is the text of a run: the arguments, or stdin.
func message(args []string, std stdio) (string, error) {
	if len(args) > 0 && !(len(args) == 1 && args[0] == "-") {
		return strings.Join(args, " "), nil
	}
	if f, ok := std.in.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			fmt.Fprintln(std.err, "reading the message from stdin; end it with Ctrl-D")
		}
	}
	data, err := io.ReadAll(io.LimitReader(std.in, 16<<20))
	if err != nil {
		return "", fmt.Errorf("read the message from stdin: %w", err)
	}
	text := strings.TrimSpace(string(data))
	if text == "" {
		return "", errors.New("no message: give it as arguments or on stdin")
	}
	return text, nil
}

// launch submits req and, unless --detach, follows the run until it ends.
// The run's feed is opened before the request is published, so nothing
// the run emits is missed.
func launch(ctx context.Context, c *client, std stdio, f *runFlags, req *protocol.RunRequest) error {
	req.Tenant = c.tenant
	if req.RunID = f.runID; req.RunID == "" {
		req.RunID = newID()
	} else if err := protocol.CheckToken("--run-id", req.RunID); err != nil {
		return err
	}
	modes, translate, err := f.modes.modes()
	if err != nil {
		return usageErr(std, "run", "%v", err)
	}
	var fd *natsagent.Events
	if !f.detach {
		if err := protocol.CheckToken("thread id", req.ThreadID); err != nil {
			return err
		}
		fd, err = c.api.Follow(ctx, req.ThreadID, req.RunID, nil)
		if err != nil {
			return fmt.Errorf("read the run's events: %w", err)
		}
		defer fd.Close()
	}
	rec, existing, err := c.submit(ctx, req)
	if err != nil {
		return err
	}
	if f.detach {
		if f.json {
			return writeJSON(std.out, rec)
		}
		_, err := fmt.Fprintln(std.out, rec.RunID)
		return err
	}
	if existing && !f.json {
		fmt.Fprintf(std.err, "run %s exists already (status %s): following it\n", rec.RunID, rec.Status)
	}
	if !f.json {
		fmt.Fprintln(std.err, detachHint(c, rec))
	}
	if translate {
		var input []model.Message
		if req.Input != nil && !existing {
			input = req.Input.Messages
		}
		return followModes(ctx, c, std, f.clientFlags, fd, rec, modes, input)
	}
	return follow(ctx, c, std, f.clientFlags, fd, rec)
}

// follow prints a run's events until it ends; Ctrl-C detaches.
func follow(ctx context.Context, c *client, std stdio, f *clientFlags, fd *natsagent.Events, rec *protocol.Run) error {
	r := newRenderer(std.out, styleFor(std), f.json, false)
	fin, err := c.followRun(ctx, fd, r, rec.ThreadID, rec.RunID)
	if errors.Is(err, errDetached) {
		r.endLine()
		fmt.Fprintf(std.err, "detached: run %s goes on. Follow it again: natsagent tail --run %s%s   cancel it: natsagent cancel --run %s%s\n",
			rec.RunID, rec.RunID, tenantFlag(c), rec.RunID, tenantFlag(c))
		return nil
	}
	if err != nil {
		return err
	}
	return exitErr(rec.RunID, fin)
}

// detachHint is the line shown when a run starts streaming.
func detachHint(c *client, rec *protocol.Run) string {
	return fmt.Sprintf("run %s on thread %s%s (Ctrl-C detaches; the run goes on)", rec.RunID, rec.ThreadID, tenantOf(c))
}

func tenantOf(c *client) string {
	if c.tenant == protocol.DefaultTenant {
		return ""
	}
	return " of tenant " + c.tenant
}

// tenantFlag is the --tenant flag to repeat in a hint, if any.
func tenantFlag(c *client) string {
	if c.tenant == protocol.DefaultTenant {
		return ""
	}
	return " --tenant " + c.tenant
}
