# basin — the two commands a newcomer needs are `make demo` and `make test`.
GO      ?= go
BIN     := bin/basin
# Packages whose tests are cheap enough to run under the race detector on every `make test`.
RACE_PKGS := ./internal/... ./sim/scenario/... ./sim/enginemetrics/... ./sim/serve/... ./sim/trace/...

.PHONY: build test lint demo bench fidelity fuzz clean

build:
	$(GO) build -o $(BIN) ./cmd/basin

# All tests, then the concurrent packages again under the race detector, then a short fuzz pass.
test: lint
	$(GO) test ./...
	$(GO) test -race $(RACE_PKGS)
	$(MAKE) --no-print-directory fuzz

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
