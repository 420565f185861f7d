// Package statuspage is the daemon's status page: one HTML page with its script and style embedded
// in the binary (no CDN, so it works on an air-gapped cluster), drawing what the daemon's API
// returns — the state and its reasons, the working set against the knee, the hit rate against its
// plateau, the budget, recent actions, and the picture that explains the trap: the completion
// curve X(N)/K against the arrival rate, with the operating point and the two equilibria. It says
// plainly what the numbers alone would hide: a dry run (decisions not acted on), a daemon that is
// blind (the state shown is held, not seen), a budget that is no budget ("∞ (count only)").
// README.md lists what it shows and why.
package statuspage

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed assets
var assets embed.FS

// Handler serves the page at / and its assets under /static/. The page reads /api/v1/status,
// /api/v1/history and /api/v1/curve from the same origin.
func Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(sub)
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", files))
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:")
		http.ServeFileFS(w, r, sub, "index.html")
	})
	return mux
}
