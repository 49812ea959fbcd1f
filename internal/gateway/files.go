package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/natsagent/natsagent/internal/bus"
	"github.com/natsagent/natsagent/internal/files"
)

// The file routes: a thread's workdir over HTTP. A thread's files exist
// independently of its record, so a person can attach files to a thread
// before its first run.
const (
	routeListFiles = "GET /threads/{thread_id}/files"
	routeGetFile   = "GET /threads/{thread_id}/files/{path...}"
	routePutFile   = "PUT /threads/{thread_id}/files/{path...}"
	routeUpload    = "POST /threads/{thread_id}/uploads"
)

// uploadsDir is where multipart uploads land (the attachments middleware
// lists it for the model).
const uploadsDir = "/uploads"

// multipartSlack is what a multipart body may hold beyond its files.
const multipartSlack = 64 << 10

// fileTimeout bounds the NATS work of one file request.
const fileTimeout = 60 * time.Second

// fileView is a file as the API shows it.
type fileView struct {
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	ModTime time.Time `json:"mod_time"`
}

func viewFile(i files.Info) fileView { return fileView{Path: i.Path, Size: i.Size, ModTime: i.ModTime} }

// bodyLimit is the body limit of a route.
func (s *Server) bodyLimit(pattern string) int64 {
	switch pattern {
	case routePutFile:
		return s.cfg.MaxFileBytes
	case routeUpload:
		return s.cfg.MaxFileBytes + multipartSlack
	case routeCreateRun, routeCreateRunStream, routeCreateRunWait,
		routeStatelessRun, routeStatelessRunStream, routeStatelessRunWait:
		// Images come inline, base64: 4 bytes for every 3.
		return s.cfg.MaxBodyBytes + int64(s.cfg.Images.MaxPerRequest)*(s.cfg.Images.MaxBytes/3*4+4)
	}
	return s.cfg.MaxBodyBytes
}

// workdir opens the workdir of the request's thread.
func (s *Server) workdir(r *http.Request, tenant string) (files.Workdir, error) {
	thread, err := pathToken(r, "thread_id")
	if err != nil {
		return nil, err
	}
	if s.cfg.Files == nil {
		return nil, errNotFound("this deployment keeps no files (files.backend: none)")
	}
	return s.cfg.Files(tenant, thread), nil
}

// filePath cleans the {path...} of a request.
func filePath(r *http.Request) (string, error) {
	p, err := files.Clean(r.PathValue("path"))
	if err != nil {
		return "", errInvalid("path", err.Error())
	}
	if p == "/" {
		return "", errInvalid("path", "name a file after /files/, for example /files/notes/a.md")
	}
	return p, nil
}

// fileError turns a workdir error into the API's error.
func fileError(p string, err error) error {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return err
	case errors.Is(err, files.ErrBadPath):
		return errInvalid("path", err.Error())
	case errors.Is(err, files.ErrNotFound):
		return errNotFound(fmt.Sprintf("file %s not found", p))
	case errors.Is(err, files.ErrContentMissing):
		return errNotFound(fmt.Sprintf("the content of file %s is no longer stored", p))
	case errors.Is(err, files.ErrIsDir):
		return errConflict(fmt.Sprintf("%s is a directory; GET .../files lists the thread's files", p))
	case errors.Is(err, files.ErrNotDir):
		return errConflict(err.Error() + ": a file is in the way of " + p)
	case errors.Is(err, files.ErrTooLarge):
		return errTooLarge(err.Error())
	case errors.Is(err, files.ErrQuota):
		return errQuota(err.Error())
	}
	return err
}

// listFiles: GET /threads/{thread_id}/files; with ?checkpoint_id= the
// files as that checkpoint had them.
func (s *Server) listFiles(w http.ResponseWriter, r *http.Request, tenant string) error {
	if m, _, ok, err := s.filesAtCheckpoint(r, tenant); ok || err != nil {
		if err != nil {
			return err
		}
		out := []fileView{}
		for _, i := range m.Infos() {
			out = append(out, viewFile(i))
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	wd, err := s.workdir(r, tenant)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), fileTimeout)
	defer cancel()
	out := []fileView{}
	if err := wd.Walk(ctx, "/", func(i files.Info) error {
		out = append(out, viewFile(i))
		return nil
	}); err != nil {
		return fileError("/", err)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// getFile: GET /threads/{thread_id}/files/{path...}. The file is sent as
// an attachment with nosniff, so an uploaded page never runs in the
// gateway's origin.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request, tenant string) error {
	wd, err := s.workdir(r, tenant)
	if err != nil {
		return err
	}
	p, err := filePath(r)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.Context(), fileTimeout)
	defer cancel()
	var data []byte
	if m, v, ok, err := s.filesAtCheckpoint(r, tenant); err != nil {
		return err
	} else if ok {
		i, found := m[p]
		if !found {
			return errNotFound(fmt.Sprintf("file %s not found at checkpoint %s", p, r.URL.Query().Get("checkpoint_id")))
		}
		if data, err = v.ReadContent(ctx, i.Hash); err != nil {
			return fileError(p, err)
		}
	} else if data, err = wd.Read(ctx, p); err != nil {
		return fileError(p, err)
	}
	ctype := mime.TypeByExtension(path.Ext(p))
	if ctype == "" {
		ctype = http.DetectContentType(data)
	}
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Content-Length", fmt.Sprint(len(data)))
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(data)
	return nil
}

// putFile: PUT /threads/{thread_id}/files/{path...}, the raw body is the
// file's content; it lands where the path says.
func (s *Server) putFile(w http.ResponseWriter, r *http.Request, tenant string) error {
	wd, err := s.workdir(r, tenant)
	if err != nil {
		return err
	}
	p, err := filePath(r)
	if err != nil {
		return err
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return fileError(p, err)
	}
	ctx, cancel := context.WithTimeout(r.Context(), fileTimeout)
	defer cancel()
	info, err := s.store(ctx, wd, p, data)
	if err != nil {
		return err
	}
	w.Header().Set("Location", r.URL.Path)
	writeJSON(w, http.StatusCreated, info)
	return nil
}

func (s *Server) store(ctx context.Context, wd files.Workdir, p string, data []byte) (fileView, error) {
	if err := wd.Write(ctx, p, data); err != nil {
		return fileView{}, fileError(p, bus.MarkStoreFull(s.names.FilesBucket(), err))
	}
	info, err := wd.Stat(ctx, p)
	if err != nil {
		return fileView{}, fileError(p, err)
	}
	return viewFile(info), nil
}

// upload: POST /threads/{thread_id}/uploads, a multipart form whose
// "file" fields are stored under /uploads/<name>, the name sanitized.
func (s *Server) upload(w http.ResponseWriter, r *http.Request, tenant string) error {
	wd, err := s.workdir(r, tenant)
	if err != nil {
		return err
	}
	mr, err := r.MultipartReader()
	if err != nil {
		return errInvalid("", "send multipart/form-data with one or more \"file\" fields: "+err.Error())
	}
	// The whole form is read before anything is stored (the body limit
	// bounds it), so a refused file stores none.
	type upload struct {
		path string
		data []byte
	}
	var ups []upload
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return err
			}
			return errInvalid("", "the multipart body is malformed: "+err.Error())
		}
		if part.FormName() != "file" {
			_ = part.Close()
			continue
		}
		p := uploadsDir + "/" + sanitizeUploadName(part.FileName())
		data, err := io.ReadAll(io.LimitReader(part, s.cfg.MaxFileBytes+1))
		_ = part.Close()
		if err != nil {
			return fileError(p, err)
		}
		if int64(len(data)) > s.cfg.MaxFileBytes {
			return errTooLarge(fmt.Sprintf("%s is over the limit of %d bytes per file", part.FileName(), s.cfg.MaxFileBytes))
		}
		ups = append(ups, upload{p, data})
	}
	ctx, cancel := context.WithTimeout(r.Context(), fileTimeout)
	defer cancel()
	out := []fileView{}
	for _, u := range ups {
		info, err := s.store(ctx, wd, u.path, u.data)
		if err != nil {
			return err
		}
		out = append(out, info)
	}
	if len(out) == 0 {
		return errInvalid("file", "the form has no \"file\" field; send each file as a field named file")
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// maxUploadName bounds an upload's file name in bytes.
const maxUploadName = 200

// sanitizeUploadName keeps the base name a browser or client sent, made
// safe for a path: letters (any script), digits, spaces and ._-()+,@ are
// kept, anything else becomes '_'; leading dots go (no hidden files, no
// ".."); a long name is cut, keeping its extension.
func sanitizeUploadName(raw string) string {
	if i := strings.LastIndexAny(raw, `/\`); i >= 0 {
		raw = raw[i+1:]
	}
	var b strings.Builder
	for _, r := range raw {
		switch {
		case r == utf8.RuneError:
			b.WriteByte('_')
		case unicode.IsLetter(r), unicode.IsDigit(r), unicode.IsMark(r), strings.ContainsRune(" ._-()+,@", r):
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	name := strings.TrimLeft(strings.TrimSpace(b.String()), ".")
	name = strings.TrimRight(name, ". ")
	if len(name) > maxUploadName {
		ext := path.Ext(name)
		if len(ext) > 20 {
			ext = ""
		}
		stem := name[:maxUploadName-len(ext)]
		for !utf8.ValidString(stem) {
			stem = stem[:len(stem)-1]
		}
		name = stem + ext
	}
	if name == "" {
		name = "upload"
	}
	return name
}
