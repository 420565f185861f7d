//go:build race

package calibrate

// raceEnabled: the race detector slows the simulated endpoint an order of magnitude, too much for
// a wall-clock step load to scrape it in time.
const raceEnabled = true
