//go:build race

package bench_test

// raceDetector is true when the test binary runs under the race detector,
// which allows at most 8128 goroutines alive at once.
const raceDetector = true
