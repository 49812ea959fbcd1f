package protocol

import (
	"fmt"
	"strings"

	"github.com/natsagent/natsagent/internal/model"
)

// Images in user input. A run request never carries an image's bytes: a
// submitter (the gateway, the Go client) stores them in the thread's
// workdir under InputImagesDir, named by their SHA-256, and the message
// holds a model.PartImageFile reference. The worker reads the file of the
// run's own thread (tenant and thread come from the subject, never from
// the reference) and sends it to the model as a data URL, for that one
// request. An http(s) image URL passes through to the model as it is;
// natsagent never fetches it.

// InputImagesDir is the workdir directory of images sent with user input.
const InputImagesDir = "/uploads/images"

// ImageTypes are the image types accepted in input, by MIME type, with
// the file extension their files get. The type is judged by the bytes
// (files.SniffImage), never by what a client declares.
var ImageTypes = map[string]string{
	"image/png":  ".png",
	"image/jpeg": ".jpg",
	"image/gif":  ".gif",
	"image/webp": ".webp",
}

// Bounds of images in input.
const (
	// MaxImageURLBytes bounds an http(s) image URL.
	MaxImageURLBytes = 2048
	// MaxMessageParts bounds the parts of one message.
	MaxMessageParts = 64
	// MaxImageBytesLimit is the largest image any deployment accepts
	// (gateway images.max_bytes may set less).
	MaxImageBytesLimit = 20 << 20
)

// InputImagePath is the workdir path of an input image.
func InputImagePath(img model.ImageFile) string {
	return InputImagesDir + "/" + img.SHA256 + ImageTypes[img.MIME]
}

// ValidSHA256 reports whether s is a SHA-256 in lower-case hex.
func ValidSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// CheckInputParts checks the parts of an input message as a run request
// carries them: text, http(s) image URLs and image file references, on
// user messages only. A data URL is refused: its bytes would be stored
// in the thread's checkpoints.
func CheckInputParts(field string, m model.Message) error {
	if len(m.Parts) == 0 {
		return nil
	}
	if m.Role != model.RoleUser {
		return invalid(field+".parts", "only user messages may hold images")
	}
	if len(m.Parts) > MaxMessageParts {
		return invalid(field+".parts", "holds %d parts; at most %d", len(m.Parts), MaxMessageParts)
	}
	for i, p := range m.Parts {
		pf := fmt.Sprintf("%s.parts[%d]", field, i)
		switch p.Type {
		case model.PartText:
		case model.PartImageURL:
			u := p.ImageURL
			switch {
			case strings.HasPrefix(u, "data:"):
				return invalid(pf+".image_url", "a data URL is not accepted in a run request: store the image in the thread's workdir under %s and send an image_file part (the gateway and the Go client do this for you)", InputImagesDir)
			case !strings.HasPrefix(u, "https://") && !strings.HasPrefix(u, "http://"):
				return invalid(pf+".image_url", "must be an http or https URL")
			case len(u) > MaxImageURLBytes:
				return invalid(pf+".image_url", "is %d bytes; at most %d", len(u), MaxImageURLBytes)
			}
		case model.PartImageFile:
			img := p.Image
			if img == nil || !ValidSHA256(img.SHA256) {
				return invalid(pf+".image_file.sha256", "must be the image's SHA-256 in lower-case hex")
			}
			if _, ok := ImageTypes[img.MIME]; !ok {
				return invalid(pf+".image_file.mime_type", "%q is not one of image/png, image/jpeg, image/gif, image/webp", clip(img.MIME, 40))
			}
			if img.Size < 0 || img.Size > MaxImageBytesLimit {
				return invalid(pf+".image_file.size", "%d is out of range", img.Size)
			}
		default:
			return invalid(pf+".type", "%q is not a part type input may hold (text, image_url, image_file)", clip(p.Type, 40))
		}
	}
	return nil
}
