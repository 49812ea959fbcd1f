package natsagent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/natsagent/natsagent"
	"github.com/natsagent/natsagent/internal/bus"
)

// A typed tool: the schema the model sees comes from the argument struct,
// and the model's JSON arguments are checked and decoded before the
// function runs.
func ExampleNewTool() {
	type weatherArgs struct {
		City string `json:"city" jsonschema:"the city, e.g. Lyon"`
		Days int    `json:"days,omitempty" jsonschema:"how many days ahead, 0 for today"`
	}
	type forecast struct {
		City string `json:"city"`
		Sky  string `json:"sky"`
	}
	weather := natsagent.NewTool("weather", "Forecast for a city.", func(ctx context.Context, in weatherArgs) (forecast, error) {
		return forecast{City: in.City, Sky: "sunny"}, nil
	})

	var schema map[string]any
	_ = json.Unmarshal(weather.Spec().Parameters, &schema)
	fmt.Println("required:", schema["required"])

	out, err := weather.Call(context.Background(), &natsagent.ToolInvocation{Args: json.RawMessage(`{"city":"Lyon"}`)})
	fmt.Println(out.Content, err)
	_, err = weather.Call(context.Background(), &natsagent.ToolInvocation{Args: json.RawMessage(`{"days":2}`)})
	fmt.Println(err != nil)
	// Output:
	// required: [city]
	// {"city":"Lyon","sky":"sunny"} <nil>
	// true
}

// piiRedactor replaces e-mail addresses in what every model call sends;
// the thread keeps the original messages (edits in WrapModelCall change
// that one request).
type piiRedactor struct{ re *regexp.Regexp }

func (piiRedactor) Name() string { return "redact_pii" }

func (p piiRedactor) WrapModelCall(ctx context.Context, rt *natsagent.Runtime, req *natsagent.ModelRequest, next natsagent.ModelHandler) (*natsagent.ModelResponse, error) {
	c := req.Clone()
	for i := range c.Messages {
		c.Messages[i].Content = p.re.ReplaceAllString(c.Messages[i].Content, "[redacted]")
	}
	return next(ctx, c)
}

// A middleware that redacts PII before every model call, and an agent
// that uses it. Here it is called directly; a Worker puts it in the
// agent's chain.
func ExampleWrapModelCall() {
	var mw natsagent.WrapModelCall = piiRedactor{re: regexp.MustCompile(`\S+@\S+`)}
	_ = natsagent.Agent{Name: "support", Middleware: []natsagent.Middleware{mw.(natsagent.Middleware)}}

	req := &natsagent.ModelRequest{Messages: []natsagent.Message{{Role: natsagent.RoleUser, Content: "mail ann@example.com"}}}
	_, _ = mw.WrapModelCall(context.Background(), &natsagent.Runtime{}, req, func(ctx context.Context, sent *natsagent.ModelRequest) (*natsagent.ModelResponse, error) {
		fmt.Println("model sees:", sent.Messages[0].Content)
		return &natsagent.ModelResponse{}, nil
	})
	fmt.Println("thread keeps:", req.Messages[0].Content)
	// Output:
	// model sees: mail [redacted]
	// thread keeps: mail ann@example.com
}

// echoModel is a custom model provider: it streams and returns the last
// message back.
var echoModel = natsagent.ModelFunc(func(ctx context.Context, req *natsagent.GenerateRequest, onDelta func(natsagent.Delta)) (*natsagent.GenerateResponse, error) {
	text := "echo: " + req.Messages[len(req.Messages)-1].Content
	for _, w := range strings.SplitAfter(text, " ") {
		if onDelta != nil {
			onDelta(natsagent.Delta{Content: w})
		}
	}
	return &natsagent.GenerateResponse{
		Message:      natsagent.Message{Role: natsagent.RoleAssistant, Content: text},
		FinishReason: natsagent.FinishStop,
	}, nil
})

// A custom model provider, routed by model name: agents whose model is
// "echo" (in Go or in the YAML) use it.
func ExampleRegisterModel() {
	if err := natsagent.RegisterModel("echo", echoModel); err != nil {
		log.Fatal(err)
	}
	resp, _ := echoModel.Generate(context.Background(), &natsagent.GenerateRequest{
		Model:    "echo",
		Messages: []natsagent.Message{{Role: natsagent.RoleUser, Content: "hi"}},
	}, nil)
	fmt.Println(resp.Message.Content)
	// Output: echo: hi
}

// A Go service submits a run and follows its events to the end. The
// example starts its own embedded NATS server and an in-process worker
// with the echo model; a real service connects to the deployment's NATS
// and leaves the workers to their own processes.
func ExampleClient() {
	dir, _ := os.MkdirTemp("", "natsagent-example")
	defer os.RemoveAll(dir)
	srv, err := bus.StartEmbedded(bus.EmbeddedConfig{StoreDir: dir, Listen: "127.0.0.1:-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := srv.Connect("example")
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	ctx, stop := context.WithTimeout(context.Background(), 2*time.Minute)
	defer stop()
	worker, err := natsagent.NewWorker(nc, natsagent.Config{Model: echoModel})
	if err != nil {
		log.Fatal(err)
	}
	workerCtx, stopWorker := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- worker.Run(workerCtx) }()
	defer func() {
		stopWorker()
		select {
		case <-done:
		case <-time.After(time.Minute):
			log.Fatal("the worker did not stop in a minute")
		}
	}()

	var client *natsagent.Client
	for client == nil { // the worker creates the streams and buckets
		if client, err = natsagent.NewClient(nc, nil); err != nil {
			if ctx.Err() != nil {
				log.Fatalf("no client before the deadline: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	events, err := client.Follow(ctx, "support-42", "run-1", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer events.Close()
	if _, err := client.Submit(ctx, natsagent.RunRequest{
		RunID: "run-1", ThreadID: "support-42", Input: natsagent.UserInput("where is my parcel?"),
	}); err != nil {
		log.Fatal(err)
	}
	for {
		ev, err := events.Next(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if f := ev.Finished(); f != nil {
			fmt.Println(f.Status, "-", f.Output.Content)
			break
		}
	}
	run, _ := client.Wait(ctx, "support-42", "run-1")
	fmt.Println("record:", run.Status)
	// Output:
	// success - echo: where is my parcel?
	// record: success
}

// A worker that adds one tool to the stock agents: the built-in chatbot
// (and every agent of the YAML that lists it) may call it.
func ExampleNewWorker() {
	lookup := natsagent.NewTool("order_status", "Looks an order up.", func(ctx context.Context, in struct {
		OrderID string `json:"order_id"`
	}) (string, error) {
		return "order " + in.OrderID + " shipped", nil
	})
	cfg := natsagent.Config{
		ConfigFile: os.Getenv("NATSAGENT_CONFIG"), // agents, middleware, limits
		Tools:      []natsagent.Tool{lookup},
	}
	// In main: natsagent.NewWorker(nc, cfg), then worker.Run(ctx) until a
	// signal; see examples/worker.
	fmt.Println(cfg.Tools[0].Spec().Name)
	// Output: order_status
}
