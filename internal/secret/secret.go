// Package secret reads the secrets basin's configs point at — bearer tokens, Slack tokens, webhook
// URLs — from a file or, when no file is configured, from an environment variable. One reader, so
// that every secret is trimmed, checked and kept out of error messages the same way.
package secret

import (
	"fmt"
	"os"
	"strings"
)

// File reads the secret in path: surrounding whitespace trimmed (editors add a final newline),
// refused when empty or more than one line (a token file holding two lines is a mistake that would
// otherwise surface as a confusing 401 later). Errors name the file and never quote its contents.
func File(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	switch {
	case s == "":
		return "", fmt.Errorf("%s: empty", path)
	case strings.ContainsAny(s, "\r\n"):
		return "", fmt.Errorf("%s: more than one line", path)
	}
	return s, nil
}

// FileOrEnv is File(path) when path is set, else the environment variable env trimmed, which may
// be empty: whether a secret is required is the caller's to say, naming its own config field.
func FileOrEnv(path, env string, getenv func(string) string) (string, error) {
	if path != "" {
		return File(path)
	}
	return strings.TrimSpace(getenv(env)), nil
}

// Bearer returns the token of an Authorization header value "Bearer <token>" (the scheme is
// case-insensitive, RFC 9110 §11.1), and whether the header had that scheme.
func Bearer(header string) (string, bool) {
	const prefix = "bearer "
	if len(header) < len(prefix) || !strings.EqualFold(header[:len(prefix)], prefix) {
		return "", false
	}
	return strings.TrimSpace(header[len(prefix):]), true
}
