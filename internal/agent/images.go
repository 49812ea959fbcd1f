package agent

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// inputImages turns the image file references of user messages into data
// URLs for one model request. A reference names content only: the file is
// read from the run's own workdir (its tenant and thread), so a request
// cannot reach another thread's images, and its bytes must hash to the
// reference. An image that cannot be shown becomes a note the model
// reads; it never fails the run. Read images are kept for the run, so a
// long run reads each once.
type inputImages struct {
	urls map[string]string // sha256 -> data URL, or "" when not shown
}

// maxCachedImageBytes bounds what a run keeps of its images in memory.
const maxCachedImageBytes = 64 << 20

func (ii *inputImages) resolve(ctx context.Context, wd files.Workdir, msgs []model.Message) []model.Message {
	var out []model.Message
	for i, m := range msgs {
		if !slices.ContainsFunc(m.Parts, func(p model.Part) bool { return p.Type == model.PartImageFile }) {
			continue
		}
		if out == nil {
			// The transcript is shared with state: copy before editing.
			out = slices.Clone(msgs)
		}
		c := m.Clone()
		for k, p := range c.Parts {
			if p.Type != model.PartImageFile || p.Image == nil {
				continue
			}
			url, err := ii.dataURL(ctx, wd, *p.Image)
			if err != nil {
				c.Parts[k] = model.Part{Type: model.PartText, Text: fmt.Sprintf("[An image the person sent (%s) cannot be shown: %v.]", protocol.InputImagePath(*p.Image), err)}
				continue
			}
			c.Parts[k] = model.Part{Type: model.PartImageURL, ImageURL: url}
		}
		out[i] = c
	}
	if out == nil {
		return msgs
	}
	return out
}

func (ii *inputImages) dataURL(ctx context.Context, wd files.Workdir, img model.ImageFile) (string, error) {
	if url, ok := ii.urls[img.SHA256]; ok && url != "" {
		return url, nil
	}
	if wd == nil {
		return "", fmt.Errorf("this deployment keeps no files")
	}
	p := protocol.InputImagePath(img)
	info, err := wd.Stat(ctx, p)
	if err != nil {
		return "", fmt.Errorf("it is not in this thread's files")
	}
	if info.IsDir || info.Size > protocol.MaxImageBytesLimit {
		return "", fmt.Errorf("it is not an image this run can send")
	}
	data, err := wd.Read(ctx, p)
	if err != nil {
		return "", fmt.Errorf("reading it failed")
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != img.SHA256 {
		return "", fmt.Errorf("the file changed since it was sent")
	}
	mime := files.SniffImage(data)
	if mime == "" {
		return "", fmt.Errorf("it is not a PNG, JPEG, GIF or WebP image")
	}
	url := "data:" + mime + ";base64," + base64.StdEncoding.EncodeToString(data)
	if ii.urls == nil {
		ii.urls = map[string]string{}
	}
	size := 0
	for _, u := range ii.urls {
		size += len(u)
	}
	if size+len(url) <= maxCachedImageBytes {
		ii.urls[img.SHA256] = url
	}
	return url, nil
}

// imageNotes is msgs for a model that takes no image input: each image
// part becomes a text note that says where the image is (its file in the
// thread's workdir, which the agent's file tools can reach, or its URL),
// so the agent can still refer to it. Nothing is read.
func imageNotes(msgs []model.Message) []model.Message {
	var out []model.Message
	for i, m := range msgs {
		if !slices.ContainsFunc(m.Parts, func(p model.Part) bool { return p.Type == model.PartImageFile || p.Type == model.PartImageURL }) {
			continue
		}
		if out == nil {
			// The transcript is shared with state: copy before editing.
			out = slices.Clone(msgs)
		}
		c := m.Clone()
		for k, p := range c.Parts {
			switch p.Type {
			case model.PartImageFile:
				c.Parts[k] = model.Part{Type: model.PartText, Text: imageFileNote(p.Image)}
			case model.PartImageURL:
				c.Parts[k] = model.Part{Type: model.PartText, Text: imageURLNote(p.ImageURL)}
			}
		}
		out[i] = c
	}
	if out == nil {
		return msgs
	}
	return out
}

func imageFileNote(img *model.ImageFile) string {
	if img == nil || !protocol.ValidSHA256(img.SHA256) || protocol.ImageTypes[img.MIME] == "" {
		return "[The person sent an image; this model cannot see images.]"
	}
	return fmt.Sprintf("[The person sent an image (%s), stored in this thread's files at %s; this model cannot see images.]", img.MIME, protocol.InputImagePath(*img))
}

func imageURLNote(url string) string {
	if (strings.HasPrefix(url, "https://") || strings.HasPrefix(url, "http://")) && len(url) <= protocol.MaxImageURLBytes && !strings.ContainsAny(url, " []\n\r") {
		return fmt.Sprintf("[The person sent an image at %s; this model cannot see images.]", url)
	}
	return "[The person sent an image; this model cannot see images.]"
}
