// Package agentcli tests basin with the real coding agents' command-line tools: Claude Code
// (npm @anthropic-ai/claude-code, Anthropic Messages) and the Codex CLI (npm @openai/codex, OpenAI
// Responses), pinned in testdata/package-lock.json. It has no code of its own outside its tests.
//
// Each test runs `basin sim serve` (the paper's 1P1D H100 deployment, answers as long as its
// workload's calls) and `basin gateway` in front of it as processes on 127.0.0.1, then the agent
// with its default settings but for where it sends its calls: the gateway, with a dummy API key,
// in a temporary home and working directory, with no environment of the test's own (no real key
// can leak in), telemetry, auto-update and other non-essential traffic off through the agents'
// documented switches, and an HTTP proxy on a loopback port nothing listens on (with only
// loopback exempt), so that any call elsewhere fails at once instead of leaving the machine.
//
// TestAgentFinishesATaskAsOneSession: each agent finishes a task (a prompt, answered at the
// model's own length, not the 32,000 tokens Claude Code asks for), then goes on with it (the
// agent's resume); the gateway's /admin/state must show one session, Claude Code's by its
// x-claude-code-session-id header, Codex's by its session id, whose context grew with the second
// turn.
//
// TestShedSessionEndsTheAgent: with the budget taken, the agent's first call queues at the
// gateway; POST /admin/shed refuses it with 529, and the agent must exit with an error within
// seconds, not sleep on a Retry-After or retry for minutes.
//
// The tests need node (Codex's launcher is a Node script), the go command (they build basin) and
// the pinned packages: `make test` installs them with `npm ci --prefix test/agentcli/testdata`.
// Without them the tests are skipped, unless the environment variable CI is set, in which case
// they fail.
package agentcli
