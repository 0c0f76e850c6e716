package console

import (
	"encoding/json"
	"errors"
	"net/http"
)

// Sentinel errors. Test for them with errors.Is.
var (
	// ErrNoTLS: a non-loopback listen address without a certificate.
	ErrNoTLS = errors.New("listening beyond loopback needs --tls-cert and --tls-key")
	// ErrTokenFile: the token file is missing, unreadable or malformed.
	ErrTokenFile = errors.New("console token file")
)

// apiError is the body of every failed API request:
// {"error": {"code", "message"}}.
type apiError struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }

func errorf(status int, code, msg string) *apiError {
	return &apiError{Status: status, Code: code, Message: msg}
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.Status, map[string]*apiError{"error": e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal","message":"encode response"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
