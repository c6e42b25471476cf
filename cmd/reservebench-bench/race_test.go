//go:build race

package main

// Under the race detector the render tests skip drawing the PNGs (see
// drawPNGs); the plain `go test` run draws them.
func init() { drawPNGs = false }
