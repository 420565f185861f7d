//go:build !race

package agentcli

const raceEnabled = false
