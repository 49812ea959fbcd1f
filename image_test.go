package natsagent_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"image"
	"image/png"
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
