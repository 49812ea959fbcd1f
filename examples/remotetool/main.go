// Command remotetool serves a natsagent remote tool with nothing but
// nats.go: a micro service marked natsagent=tools, with one endpoint per
// tool on agent.tools.<tenant>.<name> and the tool's description and JSON
// schema in the endpoint's metadata. Agents whose profile lists
// "remote__convert_temperature" (or "remote__*") can call it as soon as the
// workers have seen it. The contract is in docs/protocol.md, "Remote tools".
//
//	go run ./examples/remotetool --server nats://127.0.0.1:4222 --tenant default
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

const schema = `{
  "type": "object",
  "properties": {
    "value": {"type": "number", "description": "the temperature to convert"},
    "from":  {"type": "string", "enum": ["C", "F", "K"]},
    "to":    {"type": "string", "enum": ["C", "F", "K"]}
  },
  "required": ["value", "from", "to"]
}`

func main() {
	server := flag.String("server", envOr("NATS_URL", nats.DefaultURL), "NATS server URL")
	prefix := flag.String("prefix", "agent", "natsagent's subject prefix (nats.prefix)")
	tenants := flag.String("tenant", "default", "comma-separated tenants whose runs may call the tool")
	flag.Parse()

	nc, err := nats.Connect(*server, nats.Name("remotetool-example"))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	svc, err := micro.AddService(nc, micro.Config{
		Name:        "temperature",
		Version:     "1.0.0",
		Description: "Temperature conversion for natsagent runs",
		// The marker workers look for in $SRV.INFO answers.
		Metadata: map[string]string{"natsagent": "tools"},
	})
	if err != nil {
		log.Fatal(err)
	}
	// One endpoint per tenant: a tool is visible to the runs of the tenant
	// in its subject only.
	for _, tenant := range strings.Split(*tenants, ",") {
		err := svc.AddEndpoint("convert_temperature-"+tenant, micro.HandlerFunc(convert),
			micro.WithEndpointSubject(*prefix+".tools."+tenant+".convert_temperature"),
			micro.WithEndpointMetadata(map[string]string{
				"description": "Converts a temperature between Celsius (C), Fahrenheit (F) and Kelvin (K).",
				"schema":      schema,
				"timeout_ms":  "5000",
			}))
		if err != nil {
			log.Fatal(err)
		}
	}
	// Optional: ask the workers to look now rather than at their next
	// refresh. Sent on the service's own connection, so the server has its
	// subscriptions before any worker asks.
	if err := nc.Publish(*prefix+".tools.refresh", nil); err != nil {
		log.Fatal(err)
	}
	log.Printf("serving convert_temperature for tenants %s on %s", *tenants, nc.ConnectedUrl())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	_ = svc.Stop()
}

// convert is the tool: the request body is the model's arguments, the
// reply body the result text; a micro error is an error result the model
// reads. The Natsagent-* headers say which run called.
func convert(req micro.Request) {
	var in struct {
		Value    *float64 `json:"value"`
		From, To string
	}
	if err := json.Unmarshal(req.Data(), &in); err != nil || in.Value == nil {
		_ = req.Error("400", `arguments must be {"value": number, "from": "C"|"F"|"K", "to": "C"|"F"|"K"}`, nil)
		return
	}
	kelvin, ok := map[string]func(float64) float64{
		"C": func(v float64) float64 { return v + 273.15 },
		"F": func(v float64) float64 { return (v-32)*5/9 + 273.15 },
		"K": func(v float64) float64 { return v },
	}[strings.ToUpper(in.From)]
	if !ok {
		_ = req.Error("400", fmt.Sprintf("unknown unit %q: use C, F or K", in.From), nil)
		return
	}
	k := kelvin(*in.Value)
	var out float64
	switch strings.ToUpper(in.To) {
	case "C":
		out = k - 273.15
	case "F":
		out = (k-273.15)*9/5 + 32
	case "K":
		out = k
	default:
		_ = req.Error("400", fmt.Sprintf("unknown unit %q: use C, F or K", in.To), nil)
		return
	}
	log.Printf("run %s (tenant %s, call %s): %g %s -> %s", req.Headers().Get("Natsagent-Run"),
		req.Headers().Get("Natsagent-Tenant"), req.Headers().Get("Natsagent-Tool-Call-Id"), *in.Value, in.From, in.To)
	_ = req.Respond([]byte(strconv.FormatFloat(out, 'f', 2, 64) + " " + strings.ToUpper(in.To)))
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
