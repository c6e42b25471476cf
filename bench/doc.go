// Package bench measures what a reservation costs: throughput of successful
// reservations (goodput), latency, and the database's work per success, for
// any registered strategy on a real PostgreSQL, side by side with pgbench
// running the strategy's own SQL. It never asserts a speed: the numbers go
// to benchmark output and to docs/performance.md (cmd/reservebench-bench,
// `make bench`), never to unit tests or table 28-1.
//
// # The pieces
//
//   - [Drive] is the load generator. Closed loop: N clients, each sends its
//     next request when the previous one is answered, for a fixed window.
//     Open loop ([Load].Rate > 0): requests planned on a Poisson schedule
//     like pgbench --rate; latency runs from the planned send time, so
//     queueing for a free client counts (no coordinated omission), and the
//     schedule lag, the late requests and those never sent are reported.
//     Every client records into its own HdrHistogram per class of answer
//     (HELD, refused by the strategy, shed by admission); the histograms are
//     merged and p50/p90/p99/max read from the merge, never averaged.
//     [DriveN] sends exactly n requests, for testing.B.
//   - [Env.RunTrial] runs one trial end to end: a fresh deployment with a
//     SKU of its own, connections opened before the window, the server's
//     counters read before and after (WAL bytes and flushes, rows written,
//     commits; every connection closed first so that every backend has
//     reported its statistics), round trips counted by a pgx tracer,
//     pg_stat_activity and pg_locks sampled during the run ([Waits]), CPU
//     and context switches from /proc/stat, and the deployment's audit.
//   - [PgbenchScripter] is the optional interface through which a
//     deployment hands pgbench a script of its own SQL; Env.RunTrial with
//     [ToolPgbench] runs it (pgbench -M prepared, per-transaction log read
//     into the same histograms). [PgbenchControlScripter] adds scripts that
//     run parts of a reservation alone. A deployment without them gets no
//     pgbench run, hence no Go/pgbench ratio.
//   - [Summarize] turns repeated trials into a median and a 95% confidence
//     interval of the mean with Student's t (gonum), never 1.96·σ.
//
// Benchmarks run against a server with fsync on (pgtest.Options{Fsync:
// true}), as users run PostgreSQL; the tests' shared server has it off.
//
//	go test -run '^$' -bench . ./bench      # BenchmarkReserve/strategy=X/clients=N, testing.B
//	make bench                               # the full sweep and docs/performance.md
package bench
