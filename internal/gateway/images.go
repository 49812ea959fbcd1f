package gateway

// Images in user input. A run body may carry images as OpenAI image_url
// parts (a data: URL with base64 bytes, or an http(s) URL) or LangChain
// image blocks (base64 data with mime_type, or a url), on the LangGraph
// routes and the native format alike. The gateway decodes inline bytes,
// bounds them (images.max_bytes, 413), judges their type by the bytes
// (PNG, JPEG, GIF or WebP, 400 otherwise), and stores them in the run's
// own thread workdir under protocol.InputImagesDir, named by their
// SHA-256; the run request and the checkpoints hold only a reference
// (model.PartImageFile). A reference a client sends itself (an
// image_file block, as the thread's state shows it) is checked against
// the files of the thread the run is for, so a client cannot name another
// thread's image by its hash. http(s) URLs pass to the model untouched,
// never fetched here, or are refused when images.refuse_urls is set.

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/kv"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/protocol"
)

// Routes that create runs: their bodies may carry images.
const (
	routeCreateRun          = "POST /threads/{thread_id}/runs"
	routeCreateRunStream    = "POST /threads/{thread_id}/runs/stream"
	routeCreateRunWait      = "POST /threads/{thread_id}/runs/wait"
	routeStatelessRun       = "POST /runs"
	routeStatelessRunStream = "POST /runs/stream"
	routeStatelessRunWait   = "POST /runs/wait"
)

// Image limit defaults.
const (
	DefaultMaxImageBytes     = 5 << 20
	DefaultMaxImagesPerInput = 8
)

// ImageLimits bounds the images of user input.
type ImageLimits struct {
	// MaxBytes bounds one image (default 5 MiB, at most 20 MiB); a larger
	// one is answered 413.
	MaxBytes int64
	// MaxPerRequest bounds the images of one run request (default 8).
	MaxPerRequest int
	// RefuseURLs answers 400 to http(s) image URLs instead of passing
	// them to the model.
	RefuseURLs bool
}

func (l *ImageLimits) withDefaults() error {
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultMaxImageBytes
	}
	if l.MaxPerRequest == 0 {
		l.MaxPerRequest = DefaultMaxImagesPerInput
	}
	if l.MaxBytes < 0 || l.MaxBytes > protocol.MaxImageBytesLimit {
		return fmt.Errorf("gateway: images.max_bytes must be 1 to %d, not %d", protocol.MaxImageBytesLimit, l.MaxBytes)
	}
	if l.MaxPerRequest < 0 || l.MaxPerRequest > 64 {
		return fmt.Errorf("gateway: images.max_per_request must be 1 to 64, not %d", l.MaxPerRequest)
	}
	return nil
}

// inputImage is an image of a run body: bytes to store, or (data nil) a
// reference the client sent, to check against the thread's files.
type inputImage struct {
	field string
	ref   *model.ImageFile
	data  []byte
}

// takeImages turns the inline images of input messages into references,
// keeping their bytes for storeImages, and checks URLs and references.
// Nothing is stored yet: the caller may not use the thread.
func (s *Server) takeImages(msgs []model.Message) ([]inputImage, error) {
	var out []inputImage
	for i := range msgs {
		m := &msgs[i]
		for k := range m.Parts {
			p := &m.Parts[k]
			field := fmt.Sprintf("input.messages[%d].content[%d]", i, k)
			switch p.Type {
			case model.PartImageURL:
				if !strings.HasPrefix(p.ImageURL, "data:") {
					if s.cfg.Images.RefuseURLs {
						return nil, errInvalid(field, field+": this deployment does not pass image URLs to the model (images.refuse_urls); send the image's bytes (base64)")
					}
					if !strings.HasPrefix(p.ImageURL, "https://") && !strings.HasPrefix(p.ImageURL, "http://") {
						return nil, errInvalid(field, field+": an image URL must be http(s) or a data: URL with base64 bytes")
					}
					out = append(out, inputImage{field: field})
					continue
				}
				data, err := s.decodeDataURL(field, p.ImageURL)
				if err != nil {
					return nil, err
				}
				sum := sha256.Sum256(data)
				ref := &model.ImageFile{SHA256: hex.EncodeToString(sum[:]), MIME: files.SniffImage(data), Size: int64(len(data))}
				*p = model.Part{Type: model.PartImageFile, Image: ref}
				out = append(out, inputImage{field: field, ref: ref, data: data})
			case model.PartImageFile:
				if p.Image == nil || !protocol.ValidSHA256(p.Image.SHA256) {
					return nil, errInvalid(field, field+": image_file.sha256 must be the image's SHA-256 in lower-case hex")
				}
				out = append(out, inputImage{field: field, ref: p.Image})
			}
		}
	}
	if len(out) > s.cfg.Images.MaxPerRequest {
		return nil, errInvalid("input.messages", fmt.Sprintf("input holds %d images; at most %d per run (images.max_per_request)", len(out), s.cfg.Images.MaxPerRequest))
	}
	return out, nil
}

// decodeDataURL reads "data:<type>;base64,<bytes>" and checks the bytes
// are an allowed image of the declared type, within the size limit.
func (s *Server) decodeDataURL(field, url string) ([]byte, error) {
	meta, b64, ok := strings.Cut(strings.TrimPrefix(url, "data:"), ",")
	declared, isB64 := strings.CutSuffix(meta, ";base64")
	if !ok || !isB64 {
		return nil, errInvalid(field, field+": a data URL must be data:<image type>;base64,<bytes>")
	}
	if _, ok := protocol.ImageTypes[declared]; !ok {
		return nil, errInvalid(field, fmt.Sprintf("%s: %q is not an accepted image type (image/png, image/jpeg, image/gif, image/webp)", field, clip(declared)))
	}
	if int64(base64.StdEncoding.DecodedLen(len(b64))) > s.cfg.Images.MaxBytes+2 {
		return nil, errTooLarge(fmt.Sprintf("%s: the image is over the limit of %d bytes (images.max_bytes)", field, s.cfg.Images.MaxBytes))
	}
	data, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, errInvalid(field, field+": the image is not valid base64: "+err.Error())
	}
	switch got := files.SniffImage(data); {
	case len(data) == 0:
		return nil, errInvalid(field, field+": the image is empty")
	case int64(len(data)) > s.cfg.Images.MaxBytes:
		return nil, errTooLarge(fmt.Sprintf("%s: the image is %d bytes, over the limit of %d (images.max_bytes)", field, len(data), s.cfg.Images.MaxBytes))
	case got == "":
		return nil, errInvalid(field, field+": the bytes are not a PNG, JPEG, GIF or WebP image")
	case got != declared:
		return nil, errInvalid(field, fmt.Sprintf("%s: the bytes are %s, not the %s the data URL declares", field, got, declared))
	}
	return data, nil
}

// storeImages stores the images of a run in the workdir of its thread,
// which the caller may use, and checks the references a client sent
// name images of that same thread.
func (s *Server) storeImages(ctx context.Context, tenant, thread string, mustExist bool, imgs []inputImage) error {
	var todo []inputImage
	for _, img := range imgs {
		if img.ref != nil {
			todo = append(todo, img)
		}
	}
	if len(todo) == 0 {
		return nil
	}
	if s.cfg.Files == nil {
		return errInvalid(todo[0].field, "this deployment keeps no files (files.backend: none), so it cannot take images; send an http(s) image URL")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fileTimeout)
	defer cancel()
	if mustExist {
		// if_not_exists reject: no files for a thread that may never be.
		if _, _, err := s.stores.Threads.Get(ctx, tenant, thread); errors.Is(err, kv.ErrNotFound) {
			return errNotFound(fmt.Sprintf("thread %s not found", thread))
		} else if err != nil {
			return err
		}
	}
	wd := s.cfg.Files(tenant, thread)
	for _, img := range todo {
		if img.data == nil {
			if err := checkImageRef(ctx, wd, img); err != nil {
				return err
			}
			continue
		}
		p := protocol.InputImagePath(*img.ref)
		if info, err := wd.Stat(ctx, p); err == nil && info.Hash == img.ref.SHA256 {
			continue // the same bytes, sent before
		}
		if err := wd.Write(ctx, p, img.data); err != nil {
			return fileError(p, bus.MarkStoreFull(s.names.FilesBucket(), err))
		}
	}
	return nil
}

// checkImageRef checks a client's reference against the thread's files:
// the file must exist in this thread and hash to the reference. The
// answer never says whether another thread holds it.
func checkImageRef(ctx context.Context, wd files.Workdir, img inputImage) error {
	notHere := errInvalid(img.field, fmt.Sprintf("%s: this thread has no image with sha256 %s; send the image's bytes instead", img.field, img.ref.SHA256))
	if _, ok := protocol.ImageTypes[img.ref.MIME]; !ok {
		return notHere
	}
	p := protocol.InputImagePath(*img.ref)
	data, err := wd.Read(ctx, p)
	if errors.Is(err, files.ErrNotFound) || errors.Is(err, files.ErrContentMissing) {
		return notHere
	}
	if err != nil {
		return fileError(p, err)
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != img.ref.SHA256 || files.SniffImage(data) != img.ref.MIME {
		return notHere
	}
	img.ref.Size = int64(len(data))
	return nil
}

// countingBody counts the bytes read from a request body.
type countingBody struct {
	io.ReadCloser
	n int64
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n += int64(n)
	return n, err
}

// checkBodyBesideImages refuses a run body whose bytes, besides the inline
// images it carried (base64, each within images.max_bytes), are over
// max_body_bytes: the run routes read bodies up to that limit plus room
// for images, and that room is for images only.
func (s *Server) checkBodyBesideImages(read int64, imgs []inputImage) error {
	var room int64
	for _, img := range imgs {
		if img.data != nil {
			// The data URL: base64 (4 bytes for every 3), its prefix,
			// and JSON escapes of the prefix's slash.
			room += int64(len(img.data)+2)/3*4 + 128
		}
	}
	if read-room > s.cfg.MaxBodyBytes {
		return errTooLarge(fmt.Sprintf("request body is over the limit of %d bytes (gateway.max_body_bytes; inline images have room of their own)", s.cfg.MaxBodyBytes))
	}
	return nil
}
