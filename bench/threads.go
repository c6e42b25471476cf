package bench

import "runtime"

// clientThreads is how many OS threads run client code in a trial of this
// many clients (connections, for the open loop), for either client: pgbench
// gets it as -j, the Go client as GOMAXPROCS (useClientThreads). pgbench
// caps its threads at its clients; one thread per core otherwise.
//
// The Go side follows it because, at one client, a second P is not idle on
// a machine whose cores the server shares: each time the client's goroutine
// parks on its socket, the runtime spins on the other P looking for work
// and wakes another thread to hand the answer back, which took about 100 µs
// of every round trip of onetrip here (p50 0.57 ms against pgbench's 0.46
// ms with two Ps; 0.42 against 0.40 with one; docs/performance-method.md,
// the client's threads). A Go service on a machine of its own would not pay
// that from the database's cores; pgbench with one client does not either.
func clientThreads(clients int) int {
	return max(1, min(runtime.NumCPU(), clients))
}

// useClientThreads sets GOMAXPROCS to clientThreads(clients) for a Go
// trial and returns what puts the previous value back. GOMAXPROCS is the
// process's: trials run one at a time.
func useClientThreads(clients int) (restore func()) {
	prev := runtime.GOMAXPROCS(clientThreads(clients))
	return func() { runtime.GOMAXPROCS(prev) }
}
