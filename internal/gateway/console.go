package gateway

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

// The web console: static files (HTML, CSS and ES modules, written by hand,
// no build step) embedded in the binary and served under /console/. The
// page is one more client of the HTTP API: it holds no privilege, calls the
// same routes with the same API key as any client, and fetches nothing
// from anywhere but this gateway. The files are served without a key, since
// they hold no data; the page asks for a key when the API answers 401 and
// keeps it in sessionStorage, never in a URL.

//go:embed console
var consoleFiles embed.FS

// Console routes. They are open (auth.go): the page itself asks for the key.
const (
	routeConsole     = "GET /console/{path...}"
	routeConsoleRoot = "GET /console"
	routeRoot        = "GET /{$}"
)

// ConsolePath is where the console is served.
const ConsolePath = "/console/"

// consoleCSP allows the page its own scripts, styles, images and API calls
// and nothing else: no inline script or style, no other origin, no
// framing. A script injected into the page could neither run nor send
// anything away.
const consoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// consoleTypes are the content types of the console's files, fixed here
// rather than read from the system's MIME tables, which differ between
// machines (a module script served as text/plain does not run).
var consoleTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
}

// asset is one console file ready to serve.
type asset struct {
	data  []byte
	ctype string
	etag  string
}

// consoleAssets maps a path under /console/ ("" is the page) to its file.
var consoleAssets = loadConsole()

func init() {
	for _, p := range []string{routeConsole, routeConsoleRoot, routeRoot} {
		openRoutes[p] = true
	}
}

func loadConsole() map[string]asset {
	out := make(map[string]asset)
	root, err := fs.Sub(consoleFiles, "console")
	if err != nil {
		panic(err)
	}
	err = fs.WalkDir(root, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		ctype, ok := consoleTypes[path.Ext(p)]
		if !ok {
			return nil // not served: the list above is what the page uses
		}
		data, err := fs.ReadFile(root, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		out[p] = asset{data: data, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:16]) + `"`}
		return nil
	})
	if err != nil {
		panic(err)
	}
	out[""] = out["index.html"]
	return out
}

func (s *Server) consoleRoutes(m *http.ServeMux) {
	m.HandleFunc(routeConsole, s.serveConsole)
	m.HandleFunc(routeConsoleRoot, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, ConsolePath, http.StatusMovedPermanently)
	})
	m.HandleFunc(routeRoot, s.serveRoot)
}

// serveConsole answers a console file. Files are revalidated on every load
// (ETag), so a gateway upgrade shows its console at once.
func (s *Server) serveConsole(w http.ResponseWriter, r *http.Request) {
	a, ok := consoleAssets[r.PathValue("path")]
	if !ok {
		writeError(w, errNotFound("no console file "+clip(r.URL.Path)))
		return
	}
	h := w.Header()
	h.Set("Content-Type", a.ctype)
	h.Set("Content-Security-Policy", consoleCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", a.etag)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.data))
}

// serveRoot sends a browser to the console; any other client gets the 404
// every unknown route answers.
func (s *Server) serveRoot(w http.ResponseWriter, r *http.Request) {
	if strings.Contains(r.Header.Get("Accept"), "text/html") {
		http.Redirect(w, r, ConsolePath, http.StatusFound)
		return
	}
	writeError(w, errNotFound("no route for "+r.Method+" /; the web console is at "+ConsolePath))
}
