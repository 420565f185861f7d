//go:build race

package e2e

// raceEnabled: TestObservabilityPack's processes are built without the race detector, so a race
// run would only repeat the same three minutes.
const raceEnabled = true
