package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	var stderr bytes.Buffer
	require.Equal(t, 0, run([]string{"-o", dir}, &stderr), stderr.String())
	for _, name := range []string{"basin-overview.json", "basin-engines.json"} {
		_, err := os.Stat(filepath.Join(dir, name))
		assert.NoError(t, err)
	}

	stderr.Reset()
	assert.Equal(t, 2, run([]string{"-o", dir, "extra"}, &stderr))
	assert.Contains(t, stderr.String(), "unexpected arguments")

	// A file where the directory should be: the error names it.
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	stderr.Reset()
	assert.Equal(t, 1, run([]string{"-o", file}, &stderr))
	assert.Contains(t, stderr.String(), file)
}
