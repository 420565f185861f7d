# basin — the two commands a newcomer needs are `make demo` and `make test`.
GO      ?= go
BIN     := bin/basin
# Packages whose tests are cheap enough to run under the race detector on every `make test`.
RACE_PKGS := ./internal/... ./gateway/... ./sim/scenario/... ./sim/enginemetrics/... ./sim/serve/... \
	./sim/trace/... ./sim/loadgen/...

.PHONY: build test lint demo bench fidelity fuzz clean

build:
	$(GO) build -o $(BIN) ./cmd/basin

OPENAI_CLIENT := gateway/testdata/openai-client

# All tests, then the concurrent packages again under the race detector, then a short fuzz pass.
test: lint $(OPENAI_CLIENT)/node_modules
	$(GO) test ./...
	$(GO) test -race $(RACE_PKGS)
	$(MAKE) --no-print-directory fuzz

# The gateway's tests drive it with the real openai npm client, pinned in package-lock.json.
$(OPENAI_CLIENT)/node_modules: $(OPENAI_CLIENT)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  npm ci --prefix $(OPENAI_CLIENT) --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: the gateway's openai client test will be skipped (install Node.js 20+ and npm)"; fi

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

demo: build
	./$(BIN) demo

# Go benchmarks (simulator speed) and the policy comparison on the presets.
bench: build
	$(GO) test -run '^$$' -bench . -benchmem ./sim/...
	./$(BIN) sim compare --scenario paper-1p1d-h100-spike
	./$(BIN) sim compare --scenario paper-1p3d-h200

# Regenerates docs/fidelity.md: the paper's observations (a)–(e) over ten seeds.
fidelity: build
	./$(BIN) sim fidelity --seeds 10 --markdown > docs/fidelity.md

# A count, not a duration: Go 1.26's fuzzer can fail a time-limited run with a bare "context
# deadline exceeded" (golang/go#75804, fixed in 1.27). Longer runs: make fuzz FUZZTIME=2000000x.
FUZZTIME ?= 30000x
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzReadBasin$$' -fuzztime $(FUZZTIME) ./sim/trace/
	$(GO) test -run '^$$' -fuzz '^FuzzReadTraceLab$$' -fuzztime $(FUZZTIME) ./sim/trace/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./sim/scenario/

clean:
	rm -rf bin
