//go:build race

package harness

// raceEnabled: the race detector slows the simulator about tenfold; the simulation-heavy tests
// run in the plain pass only (the simulator and the harness are single-threaded).
const raceEnabled = true
