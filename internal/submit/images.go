package submit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// StoreImage stores an image of user input in a thread's workdir under
// protocol.InputImagesDir, named by its SHA-256, and returns the part
// that references it in a run request: a submitter that talks to NATS
// directly (the Go client, the natsagent command) does what the gateway
// does with inline images. The type is judged by the bytes.
func StoreImage(ctx context.Context, wd files.Workdir, data []byte) (model.Part, error) {
	if len(data) == 0 || len(data) > protocol.MaxImageBytesLimit {
		return model.Part{}, fmt.Errorf("an image must have 1 to %d bytes, not %d", protocol.MaxImageBytesLimit, len(data))
	}
	mime := files.SniffImage(data)
	if mime == "" {
		return model.Part{}, fmt.Errorf("not a PNG, JPEG, GIF or WebP image (judged by its bytes)")
	}
	sum := sha256.Sum256(data)
	img := &model.ImageFile{SHA256: hex.EncodeToString(sum[:]), MIME: mime, Size: int64(len(data))}
	p := protocol.InputImagePath(*img)
	if info, err := wd.Stat(ctx, p); err != nil || info.Hash != img.SHA256 {
		if err := wd.Write(ctx, p, data); err != nil {
			return model.Part{}, fmt.Errorf("store the image as %s: %w", p, err)
		}
	}
	return model.Part{Type: model.PartImageFile, Image: img}, nil
}

// ImageMessage is a user message of text and images stored with
// StoreImage.
func ImageMessage(ctx context.Context, wd files.Workdir, text string, images ...[]byte) (model.Message, error) {
	m := model.Message{Role: model.RoleUser, Content: text}
	if len(images) == 0 {
		return m, nil
	}
	if text != "" {
		m.Parts = append(m.Parts, model.Part{Type: model.PartText, Text: text})
	}
	for i, data := range images {
		p, err := StoreImage(ctx, wd, data)
		if err != nil {
			return model.Message{}, fmt.Errorf("image %d: %w", i+1, err)
		}
		m.Parts = append(m.Parts, p)
	}
	return m, nil
}
