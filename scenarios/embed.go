// Package scenarios holds the preset simulation scenarios as YAML files, embedded so that
// `basin sim run --scenario paper-1p1d-h100` works from any directory.
package scenarios

import "embed"

// FS holds every preset, named <preset>.yaml.
//
//go:embed *.yaml
var FS embed.FS
