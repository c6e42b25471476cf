// Command reservebench serves any registered strategy over HTTP (seed 000's
// API, with bounded admission in front of the database):
//
//	go run ./cmd/reservebench serve hotrow
//	go run ./cmd/reservebench serve -inflight 4 -queue 8 -wait 400ms -stock sku-lab-01=40 slotrows
//
// With RESERVEBENCH_DSN unset it starts a throwaway PostgreSQL (package
// pgtest: local binaries, else Docker) and says where; with it set it
// serves from that database. `reservebench serve -h` lists the flags. The
// performance sweep stays a command of its own, cmd/reservebench-bench
// (make bench).
//
// Exit status: 0 after a clean stop (SIGTERM or SIGINT: it stops
// admitting, finishes what it admitted and exits), 1 on a runtime failure,
// 2 on bad usage (a *UsageError).
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	_ "github.com/reservebench/reservebench/all"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		err = &UsageError{Reason: fmt.Sprintf("unknown command %q", args[0])}
	}
	var ue *UsageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "reservebench: %v\n", err)
		if ue.Usage != "" {
			fmt.Fprint(stderr, ue.Usage)
		} else {
			fmt.Fprint(stderr, usage)
		}
		return 2
	}
	fmt.Fprintf(stderr, "reservebench: %v\n", err)
	return 1
}

const usage = `usage: reservebench serve [flags] STRATEGY

  serve   seed 000's HTTP API over STRATEGY, with bounded admission
          (reservebench serve -h lists the flags)

The performance sweep is go run ./cmd/reservebench-bench (make bench).
`
