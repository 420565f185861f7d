package secret

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFileOrEnv(t *testing.T) {
	dir := t.TempDir()
	file := func(content string) string {
		p := filepath.Join(dir, t.Name()+".tok")
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		return p
	}
	env := map[string]string{"TOK": "  from-env \n"}
	for _, tc := range []struct {
		name, content, wantErr, want string
		noFile, missing              bool
	}{
		{name: "trimmed", content: " s3cret\n", want: "s3cret"},
		{name: "empty", content: " \n\t", wantErr: "empty"},
		{name: "two lines", content: "s3cret\nother\n", wantErr: "more than one line"},
		{name: "missing", missing: true, wantErr: "no such file"},
		{name: "env when no file", noFile: true, want: "from-env"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var path string
			switch {
			case tc.missing:
				path = filepath.Join(dir, "absent")
			case !tc.noFile:
				path = file(tc.content)
			}
			got, err := FileOrEnv(path, "TOK", func(k string) string { return env[k] })
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.wantErr)
				assert.NotContains(t, err.Error(), "s3cret", "an error must never quote the secret")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestBearer(t *testing.T) {
	for _, tc := range []struct {
		header, want string
		ok           bool
	}{
		{"Bearer abc", "abc", true},
		{"bearer  abc ", "abc", true},
		{"BEARER abc", "abc", true},
		{"Basic abc", "", false},
		{"Bearer", "", false},
		{"", "", false},
	} {
		got, ok := Bearer(tc.header)
		assert.Equal(t, tc.ok, ok, "%q", tc.header)
		assert.Equal(t, tc.want, got, "%q", tc.header)
	}
}
