// Package all registers every strategy of reservebench. Import it for its
// side effects; adding a strategy to the harness and the benchmarks is one
// line here:
//
//	import _ "github.com/reservebench/reservebench/all"
package all

import (
	_ "github.com/reservebench/reservebench/advisorylock"
	_ "github.com/reservebench/reservebench/combine"
	_ "github.com/reservebench/reservebench/hotrow"
	_ "github.com/reservebench/reservebench/memquota"
	_ "github.com/reservebench/reservebench/onetrip"
	_ "github.com/reservebench/reservebench/rediscounter"
	_ "github.com/reservebench/reservebench/redislock"
	_ "github.com/reservebench/reservebench/slotrows"
)
