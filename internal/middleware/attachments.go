package middleware

// Attachments. Boundary: prompt (request only) and files (read). Reads the
// workdir's /uploads once per run (before-agent, kept in the run's
// scratch) and writes nothing: each model request gets an <attachments>
// block, naming every uploaded file and its path with a sentence saying
// read_file reads them, appended to the last user message of the request's
// copy. The stored message stays as the person wrote it, so the block
// never reaches memory, titles or the history, and it always lists the
// files as they are now. Emits nothing. After DeerFlow's UploadsMiddleware,
// which instead rewrites the stored message.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
)

// UploadsDir is where attachments land in a thread's workdir.
const UploadsDir = "/uploads"

// DefaultMaxAttachments bounds the files an <attachments> block names.
const DefaultMaxAttachments = 50

// Attachments tells the model about the files a person attached.
type Attachments struct {
	// MaxFiles bounds the files named in the block (default 50); the
	// rest are counted and left to ls.
	MaxFiles int `json:"max_files"`
}

// NewAttachments fills defaults.
func NewAttachments(a Attachments) (*Attachments, error) {
	if a.MaxFiles == 0 {
		a.MaxFiles = DefaultMaxAttachments
	}
	if a.MaxFiles < 0 {
		return nil, fmt.Errorf("max_files must not be negative")
	}
	return &a, nil
}

// Name implements Middleware.
func (*Attachments) Name() string { return "attachments" }

// attachmentsScratch is a run's listing of /uploads.
type attachmentsScratch struct {
	block string
}

func (a *Attachments) scratch(rt *Runtime) *attachmentsScratch {
	return Scratch(rt, "attachments", func() *attachmentsScratch { return &attachmentsScratch{} })
}

// BeforeAgent lists the uploads once for the run.
func (a *Attachments) BeforeAgent(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	if rt.Files == nil {
		return Result{}, nil
	}
	var up []files.Info
	more := 0
	err := rt.Files.Walk(ctx, UploadsDir, func(i files.Info) error {
		if len(up) < a.MaxFiles {
			up = append(up, i)
		} else {
			more++
		}
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return Result{}, context.Cause(ctx)
		}
		// Without the listing the run goes on; the model can still ls.
		if rt.Logger != nil && !errors.Is(err, files.ErrNotFound) {
			rt.Logger.Warn("attachments: could not list the uploads", zap.Error(err))
		}
		return Result{}, nil
	}
	block := AttachmentsBlock(up, more)
	s := a.scratch(rt)
	rt.mu.Lock()
	s.block = block
	rt.mu.Unlock()
	return Result{}, nil
}

// AttachmentsBlock renders the <attachments> block for the files given
// ("" for none); more counts files left out.
func AttachmentsBlock(up []files.Info, more int) string {
	if len(up) == 0 && more == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("<attachments>\nThe person attached these files; they are in the workdir, and read_file reads them (pass the path):\n")
	for _, f := range up {
		fmt.Fprintf(&b, "%s: %s\n", strings.TrimPrefix(f.Path, UploadsDir+"/"), f.Path)
	}
	if more > 0 {
		fmt.Fprintf(&b, "... and %d more files; ls with path %s lists them all.\n", more, UploadsDir)
	}
	b.WriteString("</attachments>")
	return b.String()
}

// WrapModelCall appends the block to the request's last user message.
func (a *Attachments) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	return next(ctx, a.request(rt, req))
}

// request is the model call's request with the attachments' block added
// to the last user message (built apart: chain.go, "Frames").
func (a *Attachments) request(rt *Runtime, req *ModelRequest) *ModelRequest {
	s := a.scratch(rt)
	rt.mu.Lock()
	block := s.block
	rt.mu.Unlock()
	if block == "" {
		return req
	}
	last := -1
	for i := len(req.Messages) - 1; i >= 0; i-- {
		if req.Messages[i].Role == model.RoleUser {
			last = i
			break
		}
	}
	if last < 0 {
		return req
	}
	out := *req
	out.Messages = append([]model.Message(nil), req.Messages...)
	m := out.Messages[last].Clone()
	if strings.TrimSpace(m.Content) == "" {
		m.Content = block
	} else {
		m.Content += "\n\n" + block
	}
	out.Messages[last] = m
	return &out
}
