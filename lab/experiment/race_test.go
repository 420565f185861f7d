//go:build race

package experiment

// raceEnabled: the race detector slows the simulator about tenfold. TestLastRescue runs some
// thirty 150-minute simulations; the plain `go test` pass runs it, the race pass skips it.
const raceEnabled = true
