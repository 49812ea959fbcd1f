// Command service is a Go service that submits a run and follows it: it
// prints the answer as it streams, the tools the agent calls, and the final
// status. It needs a running deployment (a worker, or `gateway --dev`).
//
//	go run ./examples/service --server nats://127.0.0.1:4222 --thread demo "What time is it in Tokyo?"
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent"
)

func main() {
	server := flag.String("server", nats.DefaultURL, "NATS server URL")
	thread := flag.String("thread", "demo", "thread id")
	agent := flag.String("agent", "", "agent (default: chatbot)")
	flag.Parse()
	text := strings.Join(flag.Args(), " ")
	if text == "" {
		text = "Hello!"
	}

	nc, err := nats.Connect(*server)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	client, err := natsagent.NewClient(nc, nil)
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// Choose the run id, so the events can be followed before the run is
	// submitted and a retry of the submission is recognised.
	runID := fmt.Sprintf("svc-%d", time.Now().UnixNano())
	events, err := client.Follow(ctx, *thread, runID, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer events.Close()
	if _, err := client.Submit(ctx, natsagent.RunRequest{
		RunID: runID, ThreadID: *thread, Agent: *agent, Input: natsagent.UserInput(text),
	}); err != nil {
		log.Fatal(err)
	}
	for {
		ev, err := events.Next(ctx)
		if err != nil {
			// Cancel the run when the service is stopped.
			if ctx.Err() != nil {
				status, _ := client.Cancel(context.Background(), *thread, runID)
				log.Fatalf("stopped; run %s is %s", runID, status)
			}
			log.Fatal(err)
		}
		switch ev.Type {
		case natsagent.EventMessageDelta:
			fmt.Print(ev.Delta())
		case natsagent.EventToolStarted:
			fmt.Printf("\n[tool] %s\n", ev.Data)
		case natsagent.EventRunFinished:
			f := ev.Finished()
			fmt.Printf("\n[%s] %s\n", f.Status, f.Error)
			return
		}
	}
}
