// Command typedtool runs a worker with an agent defined in Go whose tool is
// a typed Go function: its JSON schema comes from the argument struct, and
// the model's arguments are checked against it before the function runs.
//
//	go run ./examples/typedtool --server nats://127.0.0.1:4222
//	natsagent run --agent converter "How much is 20 degrees C in F?"
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

type convertArgs struct {
	Value float64 `json:"value" jsonschema:"the temperature to convert"`
	From  string  `json:"from" jsonschema:"C or F"`
}

type converted struct {
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
}

func convert(ctx context.Context, in convertArgs) (converted, error) {
	switch in.From {
	case "C":
		return converted{Value: in.Value*9/5 + 32, Unit: "F"}, nil
	case "F":
		return converted{Value: (in.Value - 32) * 5 / 9, Unit: "C"}, nil
	}
	return converted{}, fmt.Errorf("from must be C or F, not %q", in.From)
}

func main() {
	server := flag.String("server", nats.DefaultURL, "NATS server URL")
	flag.Parse()
	nc, err := nats.Connect(*server)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Drain()

	w, err := natsagent.NewWorker(nc, natsagent.Config{Agents: []natsagent.Agent{{
		Name:         "converter",
		Description:  "Converts temperatures.",
		SystemPrompt: "You convert temperatures with the convert tool and answer in one sentence.",
		Tools:        []natsagent.Tool{natsagent.NewTool("convert", "Converts a temperature between C and F.", convert)},
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
