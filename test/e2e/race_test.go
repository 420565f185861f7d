//go:build race

package e2e

// raceEnabled: the processes the end-to-end tests start are built without the race detector, so
// a race run would only repeat the same minutes; they skip under it.
const raceEnabled = true
