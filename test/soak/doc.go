// Package soak holds the gateway's bounded soak test: hundreds of concurrent agent sessions
// streaming through a real gateway to `basin sim serve` on loopback for over a minute, while the
// budget is tightened and loosened through the admin API and queued sessions are shed. It checks
// that no call is lost or answered twice, that an admitted session is never refused, that the
// admission accounting adds up at the end, and that memory stays flat.
//
// The test is long, so it runs only with BASIN_SOAK=1 (or CI set) and never under -short:
//
//	BASIN_SOAK=1 go test ./test/soak -run . -v
//
// There is no non-test code here: the package exists to keep the soak apart from the quick unit
// tests of gateway and sim/serve.
package soak
