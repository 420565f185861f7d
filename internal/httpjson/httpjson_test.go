package httpjson

import (
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestWrite(t *testing.T) {
	for _, tc := range []struct {
		name       string
		write      func(w http.ResponseWriter)
		wantStatus int
		wantBody   string
	}{
		{"value", func(w http.ResponseWriter) { Write(w, 200, map[string]int{"a": 1}) }, 200, `{"a":1}` + "\n"},
		{"indented", func(w http.ResponseWriter) { WriteIndent(w, 201, map[string]int{"a": 1}) }, 201, "{\n  \"a\": 1\n}\n"},
		{"error with param and code", func(w http.ResponseWriter) {
			WriteError(w, 400, "invalid_request_error", "invalid_request", "limit", "limit: bad")
		}, 400, `{"error":{"message":"limit: bad","type":"invalid_request_error","param":"limit","code":"invalid_request"}}` + "\n"},
		{"error without param and code sends null", func(w http.ResponseWriter) {
			WriteError(w, 503, TypeFor(503), "", "", "not ready")
		}, 503, `{"error":{"message":"not ready","type":"server_error","param":null,"code":null}}` + "\n"},
		{"unencodable value is a 500 in the error shape", func(w http.ResponseWriter) { Write(w, 200, math.NaN()) },
			500, string(encodeFailed) + "\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			tc.write(rec)
			assert.Equal(t, tc.wantStatus, rec.Code)
			assert.Equal(t, tc.wantBody, rec.Body.String())
			assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
			assert.Equal(t, strconv.Itoa(len(tc.wantBody)), rec.Header().Get("Content-Length"))
		})
	}
}

func TestTypeFor(t *testing.T) {
	for status, want := range map[int]string{400: "invalid_request_error", 401: "authentication_error",
		403: "permission_error", 404: "invalid_request_error", 429: "rate_limit_error", 500: "server_error", 503: "server_error"} {
		assert.Equal(t, want, TypeFor(status), "status %d", status)
	}
}
