//go:build race

package cli

// raceEnabled: the race detector slows the simulated deployment, the gateway and the load
// generator an order of magnitude, too much for the wall-clock end-to-end test.
const raceEnabled = true
