// Package examples ships the example configurations; Demo is the one demo
// mode serves when no --config is given.
package examples

import _ "embed"

// Demo is examples/demo.yaml: three simulated models and the logical model
// `auto`, without worker URLs (demo mode starts the workers).
//
//go:embed demo.yaml
var Demo []byte
