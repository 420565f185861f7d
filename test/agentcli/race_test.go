//go:build race

package agentcli

// raceEnabled: the gateway and the simulator these tests drive are processes built without the
// race detector, and the agents are Node.js programs, so a race run would only repeat the same
// sessions; the tests skip under it.
const raceEnabled = true
