package hook

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCheckURL(t *testing.T) {
	tests := []struct {
		url, want string // want "" means accepted
	}{
		{"https://switch.example/lending", ""},
		{"http://127.0.0.1:9/x", ""},
		{"", "required, where to POST"},
		{"/lending", "/lending: want an http or https URL"},
		{"http:///lending", "http:///lending: no host"},
		{"ftp://u:secret@host/x", "ftp://u:xxxxx@host/x: want an http or https URL"},
		{"http://[::1", "missing ']'"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			err := CheckURL(tt.url, "where to POST")
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
			if err != nil {
				assert.NotContains(t, err.Error(), "secret")
			}
		})
	}
}

func TestRedact(t *testing.T) {
	assert.Equal(t, "https://u:xxxxx@h/p", Redact("https://u:pw@h/p"))
	assert.Equal(t, "https://h/p", Redact("https://h/p"))
	assert.Equal(t, "(unparsable URL)", Redact("http://[::1"))
}

func TestSnippet(t *testing.T) {
	tests := []struct {
		name, body, want string
	}{
		{"empty", "", ""},
		{"blank", " \n\t", ""},
		{"json", `{"error": "refused"}`, `: {"error": "refused"}`},
		{"folded onto one line", "<html>\n<body>bad gateway</body>\n</html>\n", ": <html> <body>bad gateway</body> </html>"},
		{"cut at the bound", strings.Repeat("x", MaxSnippet+10), ": " + strings.Repeat("x", MaxSnippet) + " …"},
		{"exactly the bound", strings.Repeat("x", MaxSnippet), ": " + strings.Repeat("x", MaxSnippet)},
		{"a character cut at the bound", strings.Repeat("x", MaxSnippet-1) + "é", ": " + strings.Repeat("x", MaxSnippet-1) + "� …"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, Snippet(strings.NewReader(tt.body)))
		})
	}
}
