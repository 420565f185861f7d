//go:build unix

package agentcli

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// agent is one real command-line agent: how to point it at the gateway and to read its answer.
type agent struct {
	name     string
	pkg, bin string // the npm package and its command
	// env is the agent's own environment for a run against gateway, from a home of its own
	// (where it may write its configuration).
	env func(t *testing.T, gateway, home string) []string
	// task is the arguments of a run that starts a session with prompt; resume of one that goes
	// on with session id.
	task   func(prompt string) []string
	resume func(id, prompt string) []string
	// parse reads what a run printed on stdout.
	parse func(t *testing.T, stdout []byte) outcome
	// shedWithin bounds how long the agent may take to exit once its session is shed.
	shedWithin time.Duration
}

// outcome is what an agent said about a run.
type outcome struct {
	session      string // its session (conversation) id
	outputTokens int64
	text         string
}

// outputCeiling is far above what the scenario's workload (terminal-bench: median 250 output
// tokens, σ 0.5) makes a call say, and far below the limits the agents ask for (Claude Code:
// 32,000): an answer this long was cut at the request's limit, not ended by the model.
const outputCeiling = 4096

var claudeCode = agent{
	name: "claude code", pkg: "@anthropic-ai/claude-code", bin: "claude",
	env: func(_ *testing.T, gateway, _ string) []string {
		return []string{
			"ANTHROPIC_BASE_URL=" + gateway, // the Anthropic clients add /v1/messages
			"ANTHROPIC_API_KEY=sk-ant-basin-test-dummy",
			// Claude Code's documented switches: no telemetry, error reports, auto-updates or other
			// traffic that is not the model's calls.
			"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
			"DISABLE_AUTOUPDATER=1",
			"DISABLE_TELEMETRY=1",
			"DISABLE_ERROR_REPORTING=1",
		}
	},
	task: func(prompt string) []string { return []string{"-p", prompt, "--output-format", "json"} },
	resume: func(id, prompt string) []string {
		return []string{"-p", prompt, "--resume", id, "--output-format", "json"}
	},
	parse: func(t *testing.T, stdout []byte) outcome {
		t.Helper()
		var r struct {
			IsError    bool   `json:"is_error"`
			StopReason string `json:"stop_reason"`
			SessionID  string `json:"session_id"`
			Result     string `json:"result"`
			Usage      struct {
				OutputTokens int64 `json:"output_tokens"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal(stdout, &r), "%s", stdout)
		require.False(t, r.IsError, "%s", stdout)
		assert.Equal(t, "end_turn", r.StopReason, "the model ended its turn")
		return outcome{session: r.SessionID, outputTokens: r.Usage.OutputTokens, text: r.Result}
	},
	// Claude Code gives up on a 529 that says not to retry (x-should-retry: false) at once.
	shedWithin: 10 * time.Second,
}

var codex = agent{
	name: "codex", pkg: "@openai/codex", bin: "codex",
	env: func(t *testing.T, gateway, home string) []string {
		t.Helper()
		// A model provider of its own: the gateway, with the Responses API, the key in the
		// environment. No update check, no analytics.
		codexHome := filepath.Join(home, ".codex")
		require.NoError(t, os.MkdirAll(codexHome, 0o700))
		cfg := fmt.Sprintf(`model_provider = "basin"
check_for_update_on_startup = false

[model_providers.basin]
name = "basin gateway"
base_url = "%s/v1"
env_key = "OPENAI_API_KEY"
wire_api = "responses"

[analytics]
enabled = false

[features]
plugins = false
remote_plugin = false
apps = false
`, gateway)
		require.NoError(t, os.WriteFile(filepath.Join(codexHome, "config.toml"), []byte(cfg), 0o600))
		return []string{"CODEX_HOME=" + codexHome, "OPENAI_API_KEY=sk-basin-test-dummy"}
	},
	task: func(prompt string) []string { return []string{"exec", "--skip-git-repo-check", "--json", prompt} },
	resume: func(id, prompt string) []string {
		return []string{"exec", "--skip-git-repo-check", "--json", "resume", id, prompt}
	},
	parse: func(t *testing.T, stdout []byte) outcome {
		t.Helper()
		var o outcome
		completed := false
		sc := bufio.NewScanner(bytes.NewReader(stdout))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var ev struct {
				Type     string `json:"type"`
				ThreadID string `json:"thread_id"`
				Item     struct {
					Type string `json:"type"`
					Text string `json:"text"`
				} `json:"item"`
				Usage struct {
					OutputTokens int64 `json:"output_tokens"`
				} `json:"usage"`
			}
			require.NoError(t, json.Unmarshal(sc.Bytes(), &ev), "%s", sc.Bytes())
			switch ev.Type {
			case "thread.started":
				o.session = ev.ThreadID
			case "item.completed":
				if ev.Item.Type == "agent_message" {
					o.text += ev.Item.Text
				}
			case "turn.completed":
				completed = true
				o.outputTokens += ev.Usage.OutputTokens
			case "turn.failed", "error":
				t.Fatalf("codex: %s", sc.Bytes())
			}
		}
		require.NoError(t, sc.Err())
		require.True(t, completed, "the turn completed:\n%s", stdout)
		return o
	},
	// Codex retries a 5xx whatever x-should-retry says, on its own schedule (without a
	// Retry-After: five reconnects of five attempts, backing off, about 25 s in all).
	shedWithin: 60 * time.Second,
}

var agents = []agent{claudeCode, codex}

// running is an agent run in the background.
type running struct {
	cmd            *exec.Cmd
	stdout, stderr bytes.Buffer
	done           chan struct{}
	err            error // set before done is closed
	ended          time.Time
}

// start runs the agent in a temporary working directory with home as its home, and nothing of
// the test's environment but PATH (node runs Codex's launcher): no real key, no proxy settings
// but the one that keeps everything but loopback off the network.
func (a agent) start(t *testing.T, s *stack, home string, args []string) *running {
	t.Helper()
	work := filepath.Join(s.dir, "work-"+strings.ReplaceAll(a.name, " ", "-"))
	require.NoError(t, os.MkdirAll(work, 0o700))
	tmp := filepath.Join(home, "tmp")
	require.NoError(t, os.MkdirAll(tmp, 0o700))
	env := []string{
		"PATH=" + os.Getenv("PATH"), "HOME=" + home, "TMPDIR=" + tmp, "TERM=dumb", "LANG=C.UTF-8",
		"HTTPS_PROXY=" + s.offNet.url, "HTTP_PROXY=" + s.offNet.url, "ALL_PROXY=" + s.offNet.url,
		"https_proxy=" + s.offNet.url, "http_proxy=" + s.offNet.url, "all_proxy=" + s.offNet.url,
		"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost",
	}
	cmd := exec.Command(needAgent(t, a.pkg, a.bin), args...)
	cmd.Dir = work
	cmd.Env = append(env, a.env(t, s.gateway, home)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r := &running{cmd: cmd, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = &r.stdout, &r.stderr
	require.NoError(t, cmd.Start(), "start %s", a.name)
	go func() {
		r.err = cmd.Wait()
		r.ended = time.Now()
		close(r.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the agent and anything it started
		<-r.done
	})
	return r
}

// wait waits up to timeout for the run to end; it fails the test if it does not.
func (r *running) wait(t *testing.T, what string, timeout time.Duration) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(timeout):
		t.Fatalf("%s: still running after %v\nstdout:\n%s\nstderr:\n%s", what, timeout,
			tail(r.stdout.String(), 20), tail(r.stderr.String(), 20))
	}
}

// run runs the agent to its end (at most two minutes: `claude -p` gave up at 120 s when every
// answer was as long as its max_tokens) and reads its outcome.
func (a agent) run(t *testing.T, s *stack, home string, args []string) outcome {
	t.Helper()
	r := a.start(t, s, home, args)
	r.wait(t, a.name, 2*time.Minute)
	require.NoError(t, r.err, "%s: stdout:\n%s\nstderr:\n%s", a.name, tail(r.stdout.String(), 20), tail(r.stderr.String(), 20))
	return a.parse(t, r.stdout.Bytes())
}

// TestAgentFinishesATaskAsOneSession runs each agent through the gateway with its defaults: it
// finishes a task, its answer as long as the model made it, and going on with the task is the
// same session at the gateway, whose context grew with it.
func TestAgentFinishesATaskAsOneSession(t *testing.T) {
	if raceEnabled {
		t.Skip("the processes under test are built without the race detector; `go test` without -race runs it")
	}
	for _, a := range agents {
		t.Run(a.name, func(t *testing.T) {
			needAgent(t, a.pkg, a.bin)
			s := startStack(t, gatewayConfig{budgetTokens: 1_500_000, maxQueueWait: 30 * time.Second})
			home := filepath.Join(s.dir, "home")
			require.NoError(t, os.MkdirAll(home, 0o700))

			first := a.run(t, s, home, a.task("List the files in this directory, then say what you found."))
			require.NotEmpty(t, first.session, "the agent names its session")
			assert.Contains(t, first.text, "the sim ran", "the simulated model's answer came back")
			assert.Positive(t, first.outputTokens)
			assert.Less(t, first.outputTokens, int64(outputCeiling),
				"the answer is as long as the workload's call, not the max_tokens the agent asked for")
			st := s.state()
			require.Equal(t, 1, st.Live, "one session: %+v", st)
			require.Len(t, st.Sessions, 1)
			assert.Equal(t, uint64(1), st.Counters.Arrivals, "every call of the task was that session's")
			assert.Equal(t, first.session, st.Sessions[0].ID, "the gateway knows the session by the agent's own id")
			before := st.Sessions[0].Context
			assert.Positive(t, before)

			second := a.run(t, s, home, a.resume(first.session, "Now summarise that in one sentence."))
			assert.Equal(t, first.session, second.session, "the agent went on with its session")
			st = s.state()
			require.Equal(t, 1, st.Live, "still one session: %+v", st)
			require.Len(t, st.Sessions, 1)
			assert.Equal(t, uint64(1), st.Counters.Arrivals, "the second turn is no new session")
			assert.Equal(t, first.session, st.Sessions[0].ID)
			assert.Greater(t, st.Sessions[0].Context, before, "the session's context grew with the second turn")
			t.Logf("%s: session %s, context %d then %d tokens, answers of %d and %d tokens",
				a.name, first.session, before, st.Sessions[0].Context, first.outputTokens, second.outputTokens)
			assert.Empty(t, s.offNet.attempts(), "the agent tried to reach the network beyond loopback")
		})
	}
}

// TestShedSessionEndsTheAgent queues each agent's first call behind a budget that is taken, sheds
// it through the gateway's admin API, and checks that the agent ends, with an error, within
// seconds: a 529 that says retrying will not help must not leave an agent waiting.
func TestShedSessionEndsTheAgent(t *testing.T) {
	if raceEnabled {
		t.Skip("the processes under test are built without the race detector; `go test` without -race runs it")
	}
	for _, a := range agents {
		t.Run(a.name, func(t *testing.T) {
			needAgent(t, a.pkg, a.bin)
			// A budget of one token, taken by a live session: every new session queues.
			s := startStack(t, gatewayConfig{budgetTokens: 1, maxQueueWait: 5 * time.Minute})
			code, b := s.do(http.MethodPost, s.gateway+"/v1/chat/completions", "",
				`{"model":"m","messages":[{"role":"user","content":"take the budget"}],"max_tokens":5}`, "x-session-id", "blocker")
			require.Equal(t, http.StatusOK, code, "%s", b)
			require.Equal(t, 1, s.state().Live, "the budget is taken")
			home := filepath.Join(s.dir, "home")
			require.NoError(t, os.MkdirAll(home, 0o700))

			r := a.start(t, s, home, a.task("Say hello."))
			deadline := time.Now().Add(time.Minute)
			var queued string
			for queued == "" {
				select {
				case <-r.done:
					t.Fatalf("%s ended before its call queued (%v)\nstdout:\n%s\nstderr:\n%s", a.name, r.err,
						tail(r.stdout.String(), 20), tail(r.stderr.String(), 20))
				default:
				}
				if st := s.state(); len(st.Queue) > 0 {
					queued = st.Queue[0].ID
				}
				require.False(t, time.Now().After(deadline), "%s's call did not queue", a.name)
				time.Sleep(50 * time.Millisecond)
			}
			shedAt := time.Now()
			code, b = s.do(http.MethodPost, s.admin+"/admin/shed", adminToken,
				fmt.Sprintf(`{"session_ids":[%q],"reason":"agentcli test"}`, queued))
			require.Equal(t, http.StatusOK, code, "%s", b)
			assert.Contains(t, string(b), queued)

			r.wait(t, a.name+" after its session was shed", a.shedWithin+30*time.Second)
			took := r.ended.Sub(shedAt)
			var exit *exec.ExitError
			require.ErrorAs(t, r.err, &exit, "%s exits with an error: stdout:\n%s\nstderr:\n%s", a.name,
				tail(r.stdout.String(), 10), tail(r.stderr.String(), 10))
			assert.Contains(t, r.stdout.String()+r.stderr.String(), "529", "the agent says why")
			assert.LessOrEqual(t, took, a.shedWithin, "%s ended %v after its session was shed", a.name, took)
			refused := s.metric(`basin_gateway_refusals_total{code="529",reason="shed"}`)
			t.Logf("%s: ended %v after the shed, exit %d, %.0f calls refused 529 shed (its queued call and retries)",
				a.name, took.Round(10*time.Millisecond), exit.ExitCode(), refused)
			assert.Empty(t, s.offNet.attempts(), "the agent tried to reach the network beyond loopback")
		})
	}
}
