package middleware_test

import (
	"context"
	"fmt"
	"image/color"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model/openaitest"
)

// models counts the model names fresh made.
var models atomic.Int64

// fresh is a model name the process has not seen: what view_image
// remembers of a model (a refusal, a logged guess) lasts the process, and
// go test -count=N runs a test N times in one.
func fresh(name string) string {
	return fmt.Sprintf("%s-%d", name, models.Add(1))
}

// hasImage reports whether a request carries an image part.
func hasImage(req *openaitest.Request) bool {
	for _, m := range req.Messages {
		for _, p := range m.Parts {
			if p.Type == "image_url" {
				return true
			}
		}
	}
	return false
}

// A model whose name looks like a vision model's, served by a provider
// that refuses image input (HTTP 400): the call is made again once with
// the placeholder, the run goes on, and the process remembers: the
// model's next run sends no image at all. The refusal is logged once.
func TestViewImageRetriesWithoutImagesTheProviderRefuses(t *testing.T) {
	wd := files.NewMemory()
	if err := wd.Write(context.Background(), "/red.png", pngBytes(t, color.RGBA{255, 0, 0, 255})); err != nil {
		t.Fatal(err)
	}
	view := viewOnce(`{"path":"/red.png"}`)
	srv := openaitest.NewServer(t, func(req *openaitest.Request) openaitest.Reply {
		if hasImage(req) {
			return openaitest.Error(http.StatusBadRequest, "image input is not supported by this model")
		}
		return view(req)
	})
	name := fresh("gpt-4o-text-only-proxy") // guessed to see images
	core, logs := observer.New(zapcore.InfoLevel)
	chain := viChain(t, `{"enabled": true}`)
	for run := 1; run <= 2; run++ {
		before := len(srv.Requests())
		res := viRunLogged(t, chain, openAIModel(t, srv), name, wd, zap.New(core))
		if res.out.Output == nil || res.out.Output.Content != "a red square" {
			t.Fatalf("run %d: output %+v", run, res.out.Output)
		}
		reqs := srv.Requests()[before:]
		images := 0
		for _, r := range reqs {
			if hasImage(&r) {
				images++
			}
		}
		if want := 2 - run; images != want {
			t.Fatalf("run %d sent %d requests with an image, want %d", run, images, want)
		}
		last := reqs[len(reqs)-1].LastMessage()
		if !strings.Contains(last.Content, "cannot see images") || !strings.Contains(last.Content, "/red.png") {
			t.Fatalf("run %d: the request after the view ends with %+v, want the placeholder", run, last)
		}
	}
	if n := logs.FilterMessageSnippet("refused image input").FilterField(zap.String("model", name)).Len(); n != 1 {
		t.Errorf("the refusal was logged %d times, want once", n)
	}
}

// A model whose name decides whether it sees images (vision unset
// everywhere) has the guess logged once, with how to set it, both ways.
func TestViewImageLogsItsGuessOncePerModel(t *testing.T) {
	wd := files.NewMemory()
	if err := wd.Write(context.Background(), "/red.png", pngBytes(t, color.RGBA{255, 0, 0, 255})); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	chain := viChain(t, `{"enabled": true}`)
	for _, tc := range []struct {
		name string
		sees bool
	}{{fresh("gpt-4o-guess-log"), true}, {fresh("local-llama-guess-log"), false}} {
		for range 2 {
			srv := openaitest.NewServer(t, viewOnce(`{"path":"/red.png"}`))
			viRunLogged(t, chain, openAIModel(t, srv), tc.name, wd, zap.New(core))
		}
		got := logs.FilterField(zap.String("model", tc.name)).FilterMessageSnippet("guessed").All()
		if len(got) != 1 {
			t.Fatalf("%s: %d guess logs, want 1", tc.name, len(got))
		}
		if sees, _ := got[0].ContextMap()["sees_images"].(bool); sees != tc.sees || !strings.Contains(got[0].Message, "vision:") {
			t.Errorf("%s: logged %q with %v, want sees_images %v and how to set vision:", tc.name, got[0].Message, got[0].ContextMap(), tc.sees)
		}
	}
}
