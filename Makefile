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

.PHONY: all build test test-unit test-alloc fuzz-short fuzz bench bench-proxy lint demo clean
.PHONY: images compose-smoke chaos soak integ

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/warmroute

# The race detector needs cgo.
test-unit:
	CGO_ENABLED=1 $(GO) test -race -shuffle=on -count=1 -timeout 15m $(PKGS)

# Allocation bounds hold without the race detector (its pools refill).
test-alloc:
	$(GO) test -count=1 -run 'Allocations' ./ring ./proxy

# Short runs of every fuzz target (the long ones are 'make fuzz').
fuzz-short:
	@FUZZTIME=$(SHORTFUZZ) ./scripts/fuzz.sh

fuzz:
	@FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

test: lint test-unit test-alloc fuzz-short compose-smoke

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count=1 $(PKGS)

# warmroute against HAProxy on this machine (installs HAProxy and wrk with
# apt-get when missing), then the ring's scale benchmarks. Needs 2+ CPUs.
bench-proxy:
	@./scripts/bench-proxy.sh $(BENCH_ARGS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
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

# Integration tier: the end-to-end tests' long runs, built with the integ
# tag. TestE2ECrashRestart kills routers (all three, the leader, a
# follower) with admin writes in flight for 20 rounds (3 in 'make test');
# every router must restart and no acknowledged write may be lost. About a
# minute. WARMROUTE_E2E_BIN=/path runs it against another build.
integ:
	CGO_ENABLED=1 $(GO) test -race -count=1 -tags integ -timeout 30m -run 'TestE2ECrash' -v ./cmd/warmroute

clean:
	rm -rf bin out
