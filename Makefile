# basin — the two commands a newcomer needs are `make demo` and `make test`.
GO      ?= go
BIN     := bin/basin
# The race pass. RACE_ONLY packages run their goroutines (or are shared between them) and run only
# there: a plain run would repeat the same tests. RACE_ALSO packages run in both passes: their
# simulation-heavy tests, single-threaded and slowed tenfold by the detector, skip under it
# (raceEnabled) and run in the plain pass. Every other package runs in the plain pass only — among
# them the end-to-end tests of test/e2e and test/agentcli, whose processes are built without the
# race detector, and the wall-clock live runs of lab/calibrate and lab/demo, too slow under it: all
# of them skip under it, so a race pass over those packages would only compile them.
RACE_ONLY := ./internal/... ./gateway/... ./remediate/... ./lender/... ./scaler/... ./collector/... ./loadgen/... ./detector/... ./daemon/statuspage/... ./sim/serve/... ./sim/scenario/... ./sim/enginemetrics/... ./test/soak/... ./test/testclock/...
RACE_ALSO := ./daemon ./cmd/... ./lab/experiment/... ./sim/harness/...
# The packages whose tests mostly wait on processes (Prometheus' rule evaluations, Alertmanager,
# redis-server, the agent CLIs) come first, so that go test starts them first and the CPU-bound
# packages run beside their waits instead of after them.
WAITING := ./test/e2e ./test/agentcli
PLAIN_PKGS = $(shell $(GO) list $(WAITING)) $(filter-out $(shell $(GO) list $(RACE_ONLY) $(WAITING)),$(shell $(GO) list ./...))

.PHONY: build test test-plain test-race lint demo bench fidelity results fuzz clean dashboards config-reference

# -buildvcs=auto: stamp the commit into `basin --version` even where GOFLAGS turns stamping off.
build:
	$(GO) build -buildvcs=auto -o $(BIN) ./cmd/basin

OPENAI_CLIENT := gateway/testdata/openai-client
ANTHROPIC_CLIENT := gateway/testdata/anthropic-client
AGENT_CLIS := test/agentcli/testdata

# Every package once without the race detector or once with it (RACE_ALSO: both). The fuzz
# targets' seed corpora run as ordinary tests here; the search for new inputs is `make fuzz`,
# which .ci/run runs after this.
# The two passes run side by side: the plain pass spends most of its time waiting on the
# end-to-end tests' processes, and the race pass fills the CPU meanwhile (on two cores: 343 s
# and 198 s one after the other, each about one core busy).
test: lint $(OPENAI_CLIENT)/node_modules $(ANTHROPIC_CLIENT)/node_modules $(AGENT_CLIS)/node_modules
	@$(MAKE) --no-print-directory -j2 test-plain test-race

test-plain:
	$(GO) test $(PLAIN_PKGS)

test-race:
	$(GO) test -race $(RACE_ONLY) $(RACE_ALSO)

# The gateway's tests drive it with the real openai npm client, pinned in package-lock.json, …
$(OPENAI_CLIENT)/node_modules: $(OPENAI_CLIENT)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  npm ci --prefix $(OPENAI_CLIENT) --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: the gateway's openai client test will be skipped (install Node.js 20+ and npm)"; fi

# … and with the real @anthropic-ai/sdk npm client, pinned the same way.
$(ANTHROPIC_CLIENT)/node_modules: $(ANTHROPIC_CLIENT)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  npm ci --prefix $(ANTHROPIC_CLIENT) --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: the gateway's anthropic client test will be skipped (install Node.js 20+ and npm)"; fi

# … and the real Claude Code and Codex command-line agents, pinned the same way, run through the
# gateway by test/agentcli's tests.
$(AGENT_CLIS)/node_modules: $(AGENT_CLIS)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  npm ci --prefix $(AGENT_CLIS) --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: the Claude Code and Codex agent tests will be skipped (install Node.js 20+ and npm)"; fi

# staticcheck at a pinned version, from the Go module proxy (its configuration: staticcheck.conf).
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

demo: build
	./$(BIN) demo

# Regenerates docs/benchmarks.md: the Go benchmarks (gateway vs a bare proxy, body parsing,
# admission, collector vs raw parse, detector, simulator, the daemon at 10k and 100k sessions) and
# the policy comparison, with the machine and every command line (about 3 minutes).
bench: build
	$(GO) run ./lab/benchreport/cmd/gen -count 3 -o docs/benchmarks.md

# Regenerates docs/fidelity.md: the paper's observations (a)–(e) over ten seeds.
fidelity: build
	./$(BIN) sim fidelity --seeds 10 --markdown > docs/fidelity.md

# A count, not a duration: Go 1.26's fuzzer can fail a time-limited run with a bare "context
# deadline exceeded" (golang/go#75804, fixed in 1.27). Longer runs: make fuzz FUZZTIME=2000000x.
# Regenerates docs/results.md: the detector against utilisation alerts over 20 seeds, the policy
# matrix (load as a fraction of each deployment's calibrated peak × spike × tier × deployment ×
# workload, 3 seeds, with its goodput-against-load plots docs/results-matrix-<workload>.svg) and the
# risk rule on the 36-deployment grid, and the spike tolerance's prediction against the simulator
# on 24 deployment × load points (about 45 minutes on two cores: the matrix's basin runs, then
# the last rescue times of sim detect's collapsed runs, basin acting and the budget cut, about
# 15 minutes; acting late on a trapped deployment with and without holds, 2 minutes; a slice:
# ./bin/basin sim matrix --loads 1.2 --tiers gpu --deployments 1p1d; basin's scaling against the
# pools as provisioned and a utilisation autoscaler, on three seeds and three more, then with a
# second spike, 5 minutes).
results: build
	{ printf '# Results\n\nTables measured in the simulator, each generated by the command it names; regenerate them all with `make results`.\n\n'; \
	  ./$(BIN) sim detect --seeds 20 --markdown; echo; ./$(BIN) sim matrix --seeds 3 --markdown --plot docs/results-matrix; echo; \
	  ./$(BIN) sim late --markdown --also-hold-bound 8m --start-deadline 5m; echo; \
	  ./$(BIN) sim riskgrid --markdown; echo; ./$(BIN) sim tolerance --seeds 5 --markdown; echo; \
	  ./$(BIN) sim scaling --markdown --plot docs/results-scaling.svg; echo; \
	  ./$(BIN) sim scaling --first-seed 4 --markdown; echo; \
	  ./$(BIN) sim scaling --loads 1.2,1.5 --spikes 100 --second-spike 45m --seeds 6 --markdown; } > docs/results.md.tmp && mv docs/results.md.tmp docs/results.md

FUZZTIME ?= 30000x
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzReadBasin$$' -fuzztime $(FUZZTIME) ./internal/trace/
	$(GO) test -run '^$$' -fuzz '^FuzzReadTraceLab$$' -fuzztime $(FUZZTIME) ./internal/trace/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./sim/scenario/
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./remediate/alerts/
	$(GO) test -run '^$$' -fuzz '^FuzzParseConfig$$' -fuzztime $(FUZZTIME) ./gateway/
	$(GO) test -run '^$$' -fuzz '^FuzzSessionIdentity$$' -fuzztime $(FUZZTIME) ./gateway/
	$(GO) test -run '^$$' -fuzz '^FuzzShapeIdentity$$' -fuzztime $(FUZZTIME) ./gateway/
	$(GO) test -run '^$$' -fuzz '^FuzzRead$$' -fuzztime $(FUZZTIME) ./internal/agentcall/
	$(GO) test -run '^$$' -fuzz '^FuzzParseConfig$$' -fuzztime $(FUZZTIME) ./daemon/
	$(GO) test -run '^$$' -fuzz '^FuzzIngestText$$' -fuzztime $(FUZZTIME) ./collector/

clean:
	rm -rf bin

# Regenerates the Grafana dashboards (dashboards/json/*.json) from dashboards/*.go; check them in.
dashboards:
	$(GO) run ./dashboards/cmd/gen -o dashboards/json

# Regenerates docs/configuration.md (every key of the gateway's and the daemon's config files, with
# its type, default and meaning) from the config structs; a test fails when it is out of date.
config-reference:
	$(GO) run ./lab/confref/cmd/gen -o docs/configuration.md
