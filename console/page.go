package console

import (
	"embed"
	"io/fs"
	"net/http"
)

// The console page: plain HTML, CSS and JavaScript, nothing fetched from
// elsewhere, so it works with the network cable pulled.
//
//go:embed web
var webFS embed.FS

func pageHandler() http.Handler {
	sub, err := fs.Sub(webFS, "web")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			writeError(w, errorf(http.StatusMethodNotAllowed, "method_not_allowed", "the page is read with GET or HEAD"))
			return
		}
		switch r.URL.Path {
		case "/", "/index.html", "/app.js", "/style.css":
		default:
			writeError(w, errorf(http.StatusNotFound, "not_found", "no such page"))
			return
		}
		files.ServeHTTP(w, r)
	})
}
