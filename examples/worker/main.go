// Command worker is a natsagent worker binary that adds one tool to the
// stock agents: the built-in chatbot may call order_status, and any agent
// of the YAML configuration may list it. Everything else (agents,
// middleware, limits, files) comes from the configuration, as with
// cmd/worker.
//
//	NATSAGENT_CONFIG=natsagent.yaml go run ./examples/worker --server nats://127.0.0.1:4222
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent"
)

type orderArgs struct {
	OrderID string `json:"order_id" jsonschema:"the order number, e.g. A-1042"`
}

func orderStatus(ctx context.Context, in orderArgs) (string, error) {
	// A real tool asks the order system; this one knows one order.
	if in.OrderID == "A-1042" {
		return "shipped on Monday, arriving Thursday", nil
	}
	return "", fmt.Errorf("no order %q; order numbers look like A-1042", in.OrderID)
}

func main() {
	server := flag.String("server", envOr("NATS_URL", nats.DefaultURL), "NATS server URL")
	flag.Parse()

	nc, err := nats.Connect(*server, nats.Name("natsagent-example-worker"))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Drain()

	w, err := natsagent.NewWorker(nc, natsagent.Config{
		ConfigFile: os.Getenv("NATSAGENT_CONFIG"),
		Tools:      []natsagent.Tool{natsagent.NewTool("order_status", "Tells where an order is.", orderStatus)},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Print("serving runs; Ctrl-C stops after the runs in flight")
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
