//go:build !race

package strategytest

// raceDetector is true when the test binary runs under the race detector.
const raceDetector = false
