package openaitest_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/natsagent/natsagent/internal/model/openaitest"
)

// pngURL is a data URL with valid base64 (the server checks the URL's
// form, not the image inside).
const pngURL = "data:image/png;base64,iVBORw0KGgo="

func parts(ps ...map[string]any) map[string]any {
	return map[string]any{"role": "user", "content": append([]map[string]any{}, ps...)}
}

func textPart(s string) map[string]any { return map[string]any{"type": "text", "text": s} }

func imagePart(url string) map[string]any {
	return map[string]any{"type": "image_url", "image_url": map[string]any{"url": url}}
}

func TestContentArrayInUserMessageIsAccepted(t *testing.T) {
	srv := openaitest.NewServer(t, nil)
	status, body := post(t, srv.URL(), map[string]any{"model": "m", "stream": false, "messages": []any{
		msg("user", "look"),
		parts(textPart("Here it is:"), imagePart(pngURL), textPart("and"), imagePart("https://example.com/a.png")),
	}})
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	if v := srv.Violations(); len(v) != 0 {
		t.Fatalf("violations %q", v)
	}
	got := srv.Requests()[0].LastMessage()
	if len(got.Parts) != 4 || got.Parts[1].ImageURL == nil || got.Parts[1].ImageURL.URL != pngURL {
		t.Fatalf("parts %+v", got.Parts)
	}
	if got.Content != "Here it is:\nand" {
		t.Fatalf("content %q, want the text parts joined", got.Content)
	}
}

func TestMalformedContentArrayIsRejected(t *testing.T) {
	cases := []struct {
		name string
		msg  any
		want string
	}{
		{"empty array", parts(), "content array is empty"},
		{"array in assistant message", map[string]any{"role": "assistant", "content": []any{textPart("x")}}, "assistant message has a content array"},
		{"text without text", parts(map[string]any{"type": "text"}), "(text) has no text"},
		{"image without url", parts(map[string]any{"type": "image_url", "image_url": map[string]any{}}), "has no image_url.url"},
		{"image without object", parts(map[string]any{"type": "image_url"}), "has no image_url.url"},
		{"unknown part type", parts(map[string]any{"type": "input_audio"}), `type "input_audio"`},
		{"file url", parts(imagePart("file:///etc/passwd")), "neither http(s) nor a data URL"},
		{"data url not base64", parts(imagePart("data:image/png,rawbytes")), "not base64"},
		{"data url not an image", parts(imagePart("data:text/plain;base64,aGk=")), `type "text/plain"`},
		{"data url bad base64", parts(imagePart("data:image/png;base64,***")), "not valid base64"},
		{"data url empty", parts(imagePart("data:image/jpeg;base64,")), "has no data"},
		{"bad detail", parts(map[string]any{"type": "image_url", "image_url": map[string]any{"url": pngURL, "detail": "max"}}), `detail "max"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := openaitest.NewServer(t, mustNotBeCalled(t))
			status, _ := post(t, srv.URL(), map[string]any{"model": "m", "messages": []any{msg("user", "hi"), tc.msg}})
			if status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400", status)
			}
			v := srv.Violations()
			if len(v) != 1 || !strings.Contains(v[0], tc.want) {
				t.Fatalf("violations %q, want one containing %q", v, tc.want)
			}
		})
	}
}
