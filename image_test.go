package natsagent_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"image"
	"image/png"
	"strings"
	"testing"

	"github.com/natsagent/natsagent"
	"github.com/natsagent/natsagent/natsagenttest"
)

// Client.ImageInput stores the image in the thread's files; the run
// request references it and the model receives its bytes.
func TestClientImageInput(t *testing.T) {
	d := natsagenttest.Start(t, natsagent.Config{}, natsagenttest.Text("A grey square."))
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, 2, 2))); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	in, err := d.Client.ImageInput(ctx, "img1", "What is this?", b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Messages[0].Parts) != 2 || in.Messages[0].Parts[1].Image == nil {
		t.Fatalf("parts %+v", in.Messages[0].Parts)
	}
	res := d.Submit(natsagent.RunRequest{ThreadID: "img1", Input: in})
	natsagenttest.RequireStatus(t, res, natsagent.StatusSuccess)
	reqs := d.ModelRequests()
	want := "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes())
	var got string
	for _, p := range reqs[0].LastMessage().Parts {
		if p.Type == "image_url" {
			got = p.ImageURL.URL
		}
	}
	if got != want {
		t.Fatalf("the model got image %.60q, want %.60q", got, want)
	}
	if _, err := d.Client.ImageInput(ctx, "img1", "x", []byte("not an image")); err == nil {
		t.Fatal("bytes that are no image were accepted")
	}
}

// An agent whose model takes no image input (Agent.NoVision, the YAML's
// vision: false) sends its model a note naming the image's file in the
// thread's workdir instead of the image; the transcript passes the strict
// validator (Start fails the test otherwise).
func TestImageInputForAModelWithoutVision(t *testing.T) {
	for name, cfg := range map[string]natsagent.Config{
		"go agent":    {Agents: []natsagent.Agent{{Name: "chatbot", NoVision: true}}},
		"yaml agent":  {ConfigYAML: []byte("agents:\n  - name: chatbot\n    vision: false\n")},
		"yaml models": {ConfigYAML: []byte("agents:\n  - name: chatbot\n    model: openai/blind-1\nmodels:\n  - name: blind-1\n    vision: false\n")},
	} {
		t.Run(name, func(t *testing.T) {
			d := natsagenttest.Start(t, cfg, natsagenttest.Text("I cannot see it."))
			var b bytes.Buffer
			if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, 2, 2))); err != nil {
				t.Fatal(err)
			}
			in, err := d.Client.ImageInput(context.Background(), "img1", "What is this?", b.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			img := in.Messages[0].Parts[1].Image
			res := d.Submit(natsagent.RunRequest{ThreadID: "img1", Input: in})
			natsagenttest.RequireStatus(t, res, natsagent.StatusSuccess)
			reqs := d.ModelRequests()
			if len(reqs) != 1 {
				t.Fatalf("%d model requests", len(reqs))
			}
			sum := sha256.Sum256(b.Bytes())
			path := "/uploads/images/" + hex.EncodeToString(sum[:]) + ".png"
			if img == nil || img.SHA256 != hex.EncodeToString(sum[:]) {
				t.Fatalf("image reference %+v", img)
			}
			noted := false
			for _, m := range reqs[0].Messages {
				if strings.Contains(string(m.Content), "data:image") {
					t.Fatalf("image bytes sent as text: %.80q", m.Content)
				}
				for _, p := range m.Parts {
					if p.Type == "image_url" {
						t.Fatalf("the model (%s) was sent an image: %.60q", reqs[0].Model, p.ImageURL.URL)
					}
					if p.Text != nil && strings.Contains(*p.Text, path) && strings.Contains(*p.Text, "cannot see images") {
						noted = true
					}
				}
			}
			if !noted {
				t.Fatalf("no note naming %s in %+v", path, reqs[0].LastMessage())
			}
		})
	}
}

// view_image on a model configured without vision (models[].vision:
// false; its name alone would say it sees images) shows it no image: the
// request after the view carries the text placeholder, and the tool
// result says the model cannot see it. Before, view_image went by the
// model's name and sent the image, which the loop then turned into a
// note that a person had sent an image. The transcript passes the strict
// validator.
func TestViewImageForAModelWithoutVision(t *testing.T) {
	cfg := natsagent.Config{ConfigYAML: []byte("agents:\n  - name: chatbot\n    model: openai/gpt-4o\n" +
		"    middleware: {settings: {view_image: {enabled: true}}}\nmodels:\n  - name: gpt-4o\n    vision: false\n")}
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, 2, 2))); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b.Bytes())
	path := "/uploads/images/" + hex.EncodeToString(sum[:]) + ".png"
	d := natsagenttest.Start(t, cfg, natsagenttest.ToolCall("view_image", `{"path":"`+path+`"}`), natsagenttest.Text("I cannot see it."))
	in, err := d.Client.ImageInput(context.Background(), "vi1", "What is this?", b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	res := d.Submit(natsagent.RunRequest{ThreadID: "vi1", Input: in})
	natsagenttest.RequireStatus(t, res, natsagent.StatusSuccess)
	reqs := d.ModelRequests()
	if len(reqs) != 2 {
		t.Fatalf("%d model requests, want the view and the answer", len(reqs))
	}
	placeholder, result := false, false
	for _, m := range reqs[1].Messages {
		if strings.Contains(string(m.Content), "data:image") {
			t.Fatalf("image bytes sent as text: %.80q", m.Content)
		}
		for _, p := range m.Parts {
			if p.Type == "image_url" {
				t.Fatalf("the model (%s, vision: false) was sent an image: %.60q", reqs[1].Model, p.ImageURL.URL)
			}
		}
		text := string(m.Content)
		if m.Role == "user" && strings.Contains(text, "You viewed these images, but the current model cannot see images") && strings.Contains(text, path) {
			placeholder = true
		}
		if m.Role == "tool" && strings.Contains(text, "The current model cannot see images") {
			result = true
		}
	}
	if !placeholder || !result {
		t.Fatalf("placeholder %v, tool result %v in %+v", placeholder, result, reqs[1].Messages)
	}
}
