package ssicount

import (
	"fmt"
	"sort"
	"strings"
)

// AttemptStats describes how many attempts the Reserve calls of this test
// binary needed so far: calls, the largest, and the histogram.
func AttemptStats() string {
	attempts.mu.Lock()
	defer attempts.mu.Unlock()
	var ns []int
	for n := range attempts.hist {
		ns = append(ns, n)
	}
	sort.Ints(ns)
	var parts []string
	for _, n := range ns {
		parts = append(parts, fmt.Sprintf("%d:%d", n, attempts.hist[n]))
	}
	return fmt.Sprintf("%d calls, at most %d attempts (of %d allowed); attempts:calls %s",
		attempts.calls, attempts.max, DefaultMaxAttempts, strings.Join(parts, " "))
}
