// Command redact runs a worker whose agents never send e-mail addresses or
// phone numbers to the model: a middleware rewrites every model request
// (the thread keeps the original messages). It is registered by name, so
// the YAML configuration can put it in any agent's chain:
//
//	agents:
//	  - name: support
//	    middleware:
//	      user:
//	        - use: redact_pii
//	          settings: {replacement: "[private]"}
//
// A Go agent (here "private") takes the middleware value directly.
//
//	NATSAGENT_CONFIG=natsagent.yaml go run ./examples/redact --server nats://127.0.0.1:4222
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"os"
	"os/signal"
	"regexp"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/natsagent/natsagent"
)

var pii = regexp.MustCompile(`[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}|\+?[0-9][0-9 ().-]{7,}[0-9]`)

// Redact replaces PII in what every model call sends. Boundary: model
// call; it reads and writes no state.
type Redact struct {
	Replacement string `json:"replacement"`
}

// Name implements natsagent.Middleware.
func (Redact) Name() string { return "redact_pii" }

// WrapModelCall edits a copy of the request: the change affects this call
// only.
func (r Redact) WrapModelCall(ctx context.Context, rt *natsagent.Runtime, req *natsagent.ModelRequest, next natsagent.ModelHandler) (*natsagent.ModelResponse, error) {
	c := req.Clone()
	for i := range c.Messages {
		c.Messages[i].Content = pii.ReplaceAllString(c.Messages[i].Content, r.Replacement)
	}
	return next(ctx, c)
}

func main() {
	server := flag.String("server", nats.DefaultURL, "NATS server URL")
	flag.Parse()

	err := natsagent.RegisterMiddleware("redact_pii", func(settings json.RawMessage) (natsagent.Middleware, error) {
		r := Redact{Replacement: "[redacted]"}
		if len(settings) > 0 {
			if err := json.Unmarshal(settings, &r); err != nil {
				return nil, err
			}
		}
		return r, nil
	})
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(*server)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Drain()
	w, err := natsagent.NewWorker(nc, natsagent.Config{
		ConfigFile: os.Getenv("NATSAGENT_CONFIG"),
		Agents: []natsagent.Agent{{
			Name:       "private",
			Middleware: []natsagent.Middleware{Redact{Replacement: "[redacted]"}},
		}},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
