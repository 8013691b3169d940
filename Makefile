# warmroute build, test and demo targets. Only Go is needed; targets that need
# more (HAProxy, Docker) say so and install or skip it themselves.

GO       ?= go
BIN      := bin/warmroute
PKGS     := ./...
VERSION  ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
COMMIT   ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS  := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
FUZZTIME ?= 60s
SHORTFUZZ ?= 5s

export CGO_ENABLED ?= 0

.PHONY: all build e2e-bin test test-unit test-alloc fuzz-short fuzz bench bench-proxy lint vet demo clean
.PHONY: images compose-smoke chaos soak integ

all: build

# No -trimpath, so that the build shares the Go build cache with 'make
# test' (a first 'make demo' after it links in seconds instead of
# compiling every package again); the images build with -trimpath.
build:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/warmroute

# The binary every end-to-end test runs, built once per 'make test' or
# 'make integ' (the test packages read it from WARMROUTE_E2E_BIN).
E2E_BIN := $(CURDIR)/bin/warmroute-e2e

e2e-bin:
	$(GO) build -ldflags '$(LDFLAGS)' -o $(E2E_BIN) ./cmd/warmroute

# The gate ('make test', what .ci/run calls): vet and gofmt, then every
# package's tests with -race -short: unit and multi-node tests, the fuzz
# targets' seeds and committed corpora as plain tests, and the end-to-end
# tests of the real binary (in parallel: most of their time is waiting).
# -short leaves out only what is long rather than important; 'make integ'
# runs it. README "Tests" lists the tiers.
TEST_PARALLEL ?= 6
test-unit: e2e-bin
	CGO_ENABLED=1 WARMROUTE_E2E_BIN=$(E2E_BIN) $(GO) test -race -short -shuffle=on -count=1 \
	  -vet=all -parallel $(TEST_PARALLEL) -timeout 10m $(PKGS)

# Allocation bounds hold without the race detector (its pools refill).
test-alloc:
	$(GO) test -count=1 -run 'Allocations' ./ring ./proxy

test: lint test-unit test-alloc

# Short runs of every fuzz target, one after another (about 6 minutes).
fuzz-short:
	@FUZZTIME=$(SHORTFUZZ) ./scripts/fuzz.sh

# Long fuzzing: every target for FUZZTIME (60s by default).
fuzz:
	@FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count=1 $(PKGS)

# warmroute against HAProxy on this machine (installs HAProxy and wrk with
# apt-get when missing), then the ring's scale benchmarks. Needs 2+ CPUs.
bench-proxy:
	@./scripts/bench-proxy.sh $(BENCH_ARGS)

# gofmt, and go vet on the packages that have no tests: 'make test' vets
# every other package inside 'go test -vet=all', on the -race build it
# compiles anyway (a separate 'go vet ./...' compiled every dependency a
# second time, a minute and more with a cold build cache). 'make vet' runs
# the whole 'go vet' on its own.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@pkgs=$$($(GO) list -f '{{if not (or .TestGoFiles .XTestGoFiles)}}{{.ImportPath}}{{end}}' $(PKGS)); \
	  if [ -n "$$pkgs" ]; then $(GO) vet $$pkgs; fi

vet:
	$(GO) vet $(PKGS)

# About 2.5 minutes: the strategies on rag and agent. DEMO_ARGS=--full runs
# the complete comparison (about 7 minutes); any 'warmroute demo' flags go
# there too.
demo: build
	./$(BIN) demo $(DEMO_ARGS)

# FROM-scratch image warmroute:dev (needs a Docker engine).
images:
	GO=$(GO) VERSION=$(VERSION) ./deploy/docker/build.sh

# Builds the image and runs the three-zone compose stack briefly; says
# SKIPPED and succeeds where no Docker engine runs.
compose-smoke:
	GO=$(GO) VERSION=$(VERSION) ./scripts/compose-smoke.sh

# Chaos suite (docs/chaos.md): kills, pauses and partitions routers, kills,
# removes and adds backends, kills the Raft leader and restarts everything
# under steady load, on local processes and then on the compose stack (built
# first; skipped where no Docker engine runs). A few minutes per target.
# CHAOS_ARGS adds flags, e.g. CHAOS_ARGS='--short --faults router-kill,backend-remove'.
chaos: build
	@if docker info >/dev/null 2>&1; then $(MAKE) --no-print-directory images; fi
	./$(BIN) chaos --target all $(CHAOS_ARGS)

# Soak test (docs/hardening.md): about 10 minutes of mixed load with client
# aborts and backend restarts; the router's goroutines and heap must stay
# flat and come back. SOAK_DURATION=30m for longer. 'make test' runs a
# short version (go test ./loadtest/soak).
soak:
	SOAK_DURATION=$(SOAK_DURATION) ./scripts/soak.sh

# Integration tier: every test without -short (what the gate leaves out:
# the Raft listener flood, the soak's short run, the multi-node tests that
# take longest), built with the integ tag for the long versions
# (TestE2ECrashRestart: 20 rounds of kill -9 with admin writes in flight,
# 3 in 'make test'), then compose-smoke. WARMROUTE_E2E_BIN=/path runs the
# end-to-end tests against another build.
integ: e2e-bin
	CGO_ENABLED=1 WARMROUTE_E2E_BIN=$${WARMROUTE_E2E_BIN:-$(E2E_BIN)} $(GO) test -race -count=1 -tags integ \
	  -parallel 4 -timeout 45m $(PKGS)
	$(MAKE) --no-print-directory compose-smoke

clean:
	rm -rf bin out
