package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoFaketime is returned by Start for Options.ClockAhead when
// libfaketime is not installed.
var ErrNoFaketime = errors.New("pgtest: libfaketime is missing (Debian: apt-get install -y libfaketime; or point RESERVEBENCH_FAKETIME at libfaketime.so.1)")

// EnvFaketime names libfaketime.so.1 when it is not where Debian puts it.
const EnvFaketime = "RESERVEBENCH_FAKETIME"

// FindFaketime returns the path of libfaketime.so.1.
func FindFaketime() (string, error) {
	candidates := []string{os.Getenv(EnvFaketime)}
	for _, pattern := range []string{"/usr/lib/*-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1", "/usr/local/lib/faketime/libfaketime.so.1"} {
		m, _ := filepath.Glob(pattern)
		candidates = append(candidates, m...)
	}
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if st, err := os.Stat(c); err == nil && st.Mode().IsRegular() {
			return c, nil
		}
	}
	return "", ErrNoFaketime
}

// serverEnv is the environment a local server starts with for opts. The
// library is found again here, not passed down: startClockAhead found it
// before the cluster was made.
func (o Options) serverEnv() []string {
	if o.ClockAhead == 0 {
		return nil
	}
	lib, _ := FindFaketime()
	// libfaketime reads a relative offset in seconds, with a sign.
	return []string{
		"LD_PRELOAD=" + lib,
		fmt.Sprintf("FAKETIME=%+.3f", o.ClockAhead.Seconds()),
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
		"FAKETIME_NO_CACHE=1",
	}
}

// startClockAhead starts a local cluster whose clock runs opts.ClockAhead
// ahead of the machine's, and checks that it does.
func startClockAhead(ctx context.Context, opts Options) (*Server, error) {
	if _, err := FindFaketime(); err != nil {
		return nil, err
	}
	lc, err := startLocal(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("pgtest: a server with its clock %v ahead needs local binaries: %w", opts.ClockAhead, err)
	}
	s := &Server{Kind: KindLocal, adminDSN: lc.dsn("postgres"), local: lc}
	if err := s.probe(ctx); err != nil {
		_ = lc.stop()
		return nil, fmt.Errorf("pgtest: local cluster started but does not answer: %w", err)
	}
	ahead, err := s.clockOffset(ctx)
	if err != nil {
		_ = lc.stop()
		return nil, err
	}
	if d := ahead - opts.ClockAhead; d < -time.Second || d > time.Second {
		_ = lc.stop()
		return nil, fmt.Errorf("pgtest: the server's clock is %v ahead of the machine's, not %v: libfaketime did not take", ahead, opts.ClockAhead)
	}
	return s, nil
}

// clockOffset reads how far the server's clock is ahead of this process's,
// from the middle of one round trip.
func (s *Server) clockOffset(ctx context.Context) (time.Duration, error) {
	conn, err := pgx.Connect(ctx, s.admin())
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	before := time.Now()
	var server time.Time
	if err := conn.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&server); err != nil {
		return 0, fmt.Errorf("pgtest: read the server's clock: %w", err)
	}
	after := time.Now()
	return server.Sub(before.Add(after.Sub(before) / 2)), nil
}
