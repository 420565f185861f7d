// Package httpjson writes JSON answers, and basin's one JSON error shape, on every HTTP API basin
// serves: the gateway (refusals and admin API), the alert receiver, the daemon's API and the
// simulator's OpenAI-compatible server. The shape is OpenAI's, {"error":{"message","type","param",
// "code"}}, because the gateway must answer agents in the shape their SDKs parse, and one shape
// everywhere lets an operator's tooling read any of basin's refusals the same way.
package httpjson

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Error is the body of an error answer: {"error": {...}}.
type Error struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the error itself. Param and Code are JSON null when not given, as OpenAI sends
// them, so a client can tell "no field at fault" from a field named "".
type ErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// NewError is the error body for a message of an error type (OpenAI's "invalid_request_error",
// "authentication_error", …), with an optional machine-readable code and the request field at
// fault (param); empty code and param are sent as null.
func NewError(typ, code, param, message string) Error {
	e := Error{Error: ErrorDetail{Message: message, Type: typ}}
	if code != "" {
		e.Error.Code = &code
	}
	if param != "" {
		e.Error.Param = &param
	}
	return e
}

// encodeFailed answers when a value cannot be encoded: a bug, said in the usual shape.
var encodeFailed = []byte(`{"error":{"message":"encoding the response failed","type":"server_error","param":null,"code":null}}`)

// Write answers status with v as compact JSON and a trailing newline. Content-Length is set, so
// that a client (or a proxy in front of it) never sees a chunked error body.
func Write(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, encodeFailed
	}
	write(w, status, b)
}

// WriteIndent is Write, indented for APIs that people read with curl (the daemon's).
func WriteIndent(w http.ResponseWriter, status int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		status, b = http.StatusInternalServerError, encodeFailed
	}
	write(w, status, b)
}

// WriteError answers status with NewError(typ, code, param, message).
func WriteError(w http.ResponseWriter, status int, typ, code, param, message string) {
	Write(w, status, NewError(typ, code, param, message))
}

func write(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// TypeFor is the OpenAI error type of an HTTP status, for APIs whose errors carry no finer type.
func TypeFor(status int) string {
	switch status {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusRequestEntityTooLarge:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	default:
		return "server_error"
	}
}
