package model_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/model/openaitest"
)

// A user message with parts goes out as a content array (text and
// image_url parts); a message without parts stays a plain string.
func TestOpenAISendsContentParts(t *testing.T) {
	srv := openaitest.NewServer(t, nil)
	m := newOpenAI(t, srv)
	const url = "data:image/png;base64,iVBORw0KGgo="
	req := &model.Request{System: "sys", Messages: []model.Message{
		{Role: model.RoleUser, Content: "look at this"},
		{Role: model.RoleUser, Content: "Here it is", Parts: []model.Part{
			{Type: model.PartText, Text: "Here it is"},
			{Type: model.PartImageURL, ImageURL: url},
		}},
	}}
	if _, err := m.Generate(context.Background(), req, nil); err != nil {
		t.Fatal(err)
	}
	noViolations(t, srv)
	got := srv.Requests()[0]
	if p := got.Messages[1].Parts; len(p) != 0 {
		t.Fatalf("a plain message was sent as parts: %+v", p)
	}
	p := got.Messages[2].Parts
	if len(p) != 2 || p[0].Type != "text" || *p[0].Text != "Here it is" || p[1].Type != "image_url" || p[1].ImageURL.URL != url {
		t.Fatalf("parts on the wire %+v", p)
	}
	if !strings.Contains(string(got.Raw), `"content":[{"type":"text"`) {
		t.Fatalf("no content array in %s", got.Raw)
	}
}

func TestOpenAIRefusesBadPartsBeforeSending(t *testing.T) {
	srv := openaitest.NewServer(t, nil)
	m := newOpenAI(t, srv)
	for name, msg := range map[string]model.Message{
		"assistant":  {Role: model.RoleAssistant, Content: "x", Parts: []model.Part{{Type: model.PartText, Text: "x"}}},
		"empty text": {Role: model.RoleUser, Parts: []model.Part{{Type: model.PartText}}},
		"no url":     {Role: model.RoleUser, Parts: []model.Part{{Type: model.PartImageURL}}},
		"unknown":    {Role: model.RoleUser, Parts: []model.Part{{Type: "audio"}}},
	} {
		req := &model.Request{Messages: []model.Message{{Role: model.RoleUser, Content: "hi"}, msg}}
		if _, err := m.Generate(context.Background(), req, nil); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if srv.Count() != 0 {
		t.Fatalf("%d requests sent", srv.Count())
	}
}

// Stored messages (checkpoints) written before parts existed still decode,
// and a message without parts encodes as it did.
func TestMessageJSONWithoutPartsUnchanged(t *testing.T) {
	old := `{"id":"m1","role":"user","content":"hi","meta":{"run_id":"r1"}}`
	var m model.Message
	if err := json.Unmarshal([]byte(old), &m); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != old {
		t.Fatalf("re-encoded as %s", out)
	}
	c := model.Message{Role: model.RoleUser, Parts: []model.Part{{Type: model.PartText, Text: "a"}}}.Clone()
	d := c.Clone()
	d.Parts[0].Text = "b"
	if c.Parts[0].Text != "a" {
		t.Fatal("Clone shares the parts")
	}
}
