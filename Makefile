# reservebench: the two commands a newcomer needs are `make table` and `make test`.
GO ?= go

.PHONY: all table test test-short detect soak bench bench-quick lint deps

all: test

## deps: install PostgreSQL, libfaketime and redis-server when missing (Debian: apt-get install -y postgresql libfaketime redis-server)
deps:
	@./scripts/ensure-postgres.sh
	@./scripts/ensure-redis.sh

## table: rebuild table 28-1 (docs/table-28-1.md) from real transactions
table: deps
	$(GO) test -count=1 -timeout 60m ./compare

## test: vet plus the whole suite under the race detector, and beside it table 28-1 without the
## race detector and the out-of-tree example module (its own go.mod: the kit and the table
## through exported API only; its table at -short size). After the rest, the module's tests
## ran 46 s on cores half idle (4m38s in all; 2026-12-07). The table's harness runs under the race detector
## in strategytest and in every strategy's conformance test; the table itself under it would take
## three minutes of the five make test has on 2 cores. Six packages at once (-p 6): one at a time
## per core left the machine 64% idle, the kit's checks waiting on holds and locks (5m35s for the
## race suite alone, 2m20s with -p 6, 2026-12-07).
## RACE_FIRST: the race suite's longest packages (1.5 to 2.5 min each beside the table), started
## first: go test starts packages in the order given, and in its own, alphabetical one, the
## redis* and slotrows packages began last and ran on alone for a minute.
RACE_FIRST = ./memquota ./advisorylock ./combine ./hotrow ./rediscounter ./redislock ./slotrows ./bench ./onetrip
test: deps
	$(GO) vet ./...
	cd examples/outoftree && $(GO) vet ./...
	@set -e; $(GO) test -p 6 -race -count=1 -timeout 60m -skip '^TestTable28_1$$' $(RACE_FIRST) ./... & race=$$!; \
	  (cd examples/outoftree && $(GO) test -count=1 -timeout 30m -short ./...) & outoftree=$$!; \
	  table=0; $(GO) test -count=1 -timeout 60m -run '^TestTable28_1$$' ./compare || table=$$?; \
	  wait $$race; wait $$outoftree; exit $$table

## detect: run every negative control's scenarios DETECT_RUNS times and write docs/detection.md
## (per-trial detection rates and the chance that one `go test ./compare` misses a control)
DETECT_RUNS ?= 50
detect: deps
	RESERVEBENCH_DETECT=$(DETECT_RUNS) $(GO) test -count=1 -timeout 60m -run TestDetectionRates -v ./compare/internal/controls

## soak: every strategy SOAK_FOR (per strategy, two at a time) under a nemesis of faults on a
## schedule drawn from SOAK_SEED (default: the time): docs/soak.md; fails on any violation
SOAK_FOR ?= 60s
soak: deps
	RESERVEBENCH_SOAK=$(SOAK_FOR) RESERVEBENCH_SOAK_SEED=$(SOAK_SEED) $(GO) test -count=1 -timeout 60m -run TestSoak -v ./soak

## test-short: fewer repetitions, for a quick local loop
test-short: deps
	$(GO) test -short -count=1 ./...

## bench: the performance sweep, fsync on (docs/performance.md, docs/perf/), planned for 15 minutes on 2 cores (12 to 22 measured, by VM)
bench: deps
	$(GO) run ./cmd/reservebench-bench

## bench-quick: the same outputs from fewer points and trials, planned for 3 minutes
bench-quick: deps
	$(GO) run ./cmd/reservebench-bench -quick

## lint: formatting and vet
lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
