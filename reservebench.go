// Package reservebench compares ways of handing out N scarce units to many
// simultaneous requests without ever selling N+1. This root package holds
// only this overview; the code lives in the packages below it:
//
//	strategy               the contract every strategy implements, and its registry
//	strategy/strategytest  the conformance kit and the scenarios every strategy is run against
//	pgtest                 a real PostgreSQL for tests, the harness and the benchmarks
//	redistest              a real Redis, the same way
//	resourcetest           what a strategy needs besides PostgreSQL (Meta.Needs), started for it
//	hotrow, slotrows, memquota, advisorylock, redislock, rediscounter  the strategies of table 28-1
//	all                    one import line per strategy
//	compare                the harness: `go test ./compare` rewrites docs/table-28-1.md
//	admission              bounded admission in front of any strategy
//	admission/ratelimit    a per-user rate limiter in Redis in front of any strategy
//	bench                  the performance library behind `make bench`
package reservebench
