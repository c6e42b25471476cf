// Package soak is the long randomized run of issue 16, outside `make test`:
// `make soak` runs strategytest.Soak against every registered strategy, each
// on a cluster of its own, for minutes, while a nemesis injects the suite's
// faults on a schedule drawn from a seed (connections cut mid-statement and
// mid-COMMIT, partitions, server crashes, failovers to a synchronous
// standby, node restarts), checks the history and the audit after every
// cycle, and writes docs/soak.md. It fails when a strategy breaks a
// guarantee it claims, or a fault could not be run.
package soak
