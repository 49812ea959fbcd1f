// Command custommodel runs a worker with a model provider written in Go:
// anything that implements natsagent.Model (Generate, streaming deltas).
// It is registered under a model name; agents whose model is "shouty" (in
// Go or in the YAML) use it, and the rest keep the configured provider.
//
//	go run ./examples/custommodel --server nats://127.0.0.1:4222
//	natsagent run --agent loud "hello there"
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent"
)

// shouty answers with the last user message in capitals, streamed word by
// word. A real provider calls its API here, honours ctx (a cancelled run
// cancels it) and reports usage.
type shouty struct{}

func (shouty) Generate(ctx context.Context, req *natsagent.GenerateRequest, onDelta func(natsagent.Delta)) (*natsagent.GenerateResponse, error) {
	var last string
	for _, m := range req.Messages {
		if m.Role == natsagent.RoleUser {
			last = m.Content
		}
	}
	text := strings.ToUpper(last) + "!"
	for _, w := range strings.SplitAfter(text, " ") {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if onDelta != nil {
			onDelta(natsagent.Delta{Content: w})
		}
	}
	return &natsagent.GenerateResponse{
		Message:      natsagent.Message{Role: natsagent.RoleAssistant, Content: text},
		FinishReason: natsagent.FinishStop,
	}, nil
}

func main() {
	server := flag.String("server", nats.DefaultURL, "NATS server URL")
	flag.Parse()
	if err := natsagent.RegisterModel("shouty", shouty{}); err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(*server)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Drain()
	w, err := natsagent.NewWorker(nc, natsagent.Config{Agents: []natsagent.Agent{{
		Name: "loud", Model: "shouty", Disable: []string{"title"},
	}}})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
