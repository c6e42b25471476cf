# reservebench: the two commands a newcomer needs are `make table` and `make test`.
GO ?= go

.PHONY: all table test test-short bench bench-quick lint deps

all: test

## deps: install PostgreSQL and redis-server binaries when missing (Debian: apt-get install -y postgresql redis-server)
deps:
	@./scripts/ensure-postgres.sh
	@./scripts/ensure-redis.sh

## table: rebuild table 28-1 (docs/table-28-1.md) from real transactions
table: deps
	$(GO) test -count=1 ./compare

## test: vet plus the whole suite under the race detector
test: deps
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...

## test-short: fewer repetitions, for a quick local loop
test-short: deps
	$(GO) test -short -count=1 ./...

## bench: the performance sweep, fsync on (docs/performance.md, docs/perf/), under 15 minutes on 2 cores
bench: deps
	$(GO) run ./cmd/reservebench-bench

## bench-quick: the same outputs from fewer points and trials, under 3 minutes
bench-quick: deps
	$(GO) run ./cmd/reservebench-bench -quick

## lint: formatting and vet
lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
