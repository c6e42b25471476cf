package main

import (
	"bytes"
	"fmt"
	"sort"
	"strings"

	"github.com/google/pprof/profile"
)

// clientProfile is where the Go client's CPU time went in one profiled
// trial (experiment "profile"): the whole process, which during a trial
// runs nothing but the client (the load generator, pgx and the strategy's
// Go code) and the Go runtime under them. It is stored in results.json, so
// -render can write it again; the raw profile is written next to the
// results, not committed.
type clientProfile struct {
	Samples int64 `json:"samples"` // at pprof's 100 Hz
	// Categories split the CPU time by the frame it was spent in (flat),
	// ordered by share; they add up to 1.
	Categories []share `json:"categories"`
	// Inside are the shares of CPU time spent under (cumulative) the
	// layers of the client (pgx, the strategy's own code, the load
	// generator) and two mechanisms (mechPgxTimer, mechIdleSearch). They
	// overlap (the strategy calls pgx).
	Inside []share `json:"inside"`
	// Top are the functions with the most flat time.
	Top []share `json:"top"`
}

type share struct {
	Name  string  `json:"name"`
	Share float64 `json:"share"`
}

// The categories of flat CPU time, in the order the report lists them when
// shares tie. Each sample goes to the first whose rule matches its stack.
const (
	catSocket    = "socket reads and writes (kernel, Go's poller)"
	catGC        = "garbage collection and allocation"
	catRuntime   = "Go runtime: scheduling, timers, futex, netpoll"
	catPgx       = "pgx and pgxpool: protocol, encoding, the pool"
	catStrategy  = "the strategy's Go code"
	catGenerator = "load generator and measurement (bench, HdrHistogram)"
	catOther     = "standard library (time, sync, strconv, ...)"
)

// Two mechanisms the profiles of every strategy show under the client,
// measured cumulatively beside the layers: pgconn arms a 15 ms timer
// around every flush (its guard against a write/read deadlock), and
// arming a timer wakes Go's netpoller (a futex wake, then an epoll_wait);
// and a P that ran out of goroutines searches for work (findRunnable:
// stealing, netpoll, then sleeping on a futex) before its thread parks,
// once per answer a client goroutine waits for.
const (
	mechPgxTimer   = "pgx's write-deadlock timer, armed per flush (cum.)"
	mechIdleSearch = "the scheduler looking for work (cum.)"
)

const module = "github.com/reservebench/reservebench/"

// summarizeProfile reads a CPU profile (runtime/pprof's gzipped protobuf)
// and sorts its samples into categories.
func summarizeProfile(data []byte, strategy string) (*clientProfile, error) {
	p, err := profile.Parse(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("profile of %s: %w", strategy, err)
	}
	vi := len(p.SampleType) - 1 // cpu nanoseconds
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			vi = i
		}
	}
	var total float64
	var samples int64
	flat, inside, leaf := map[string]float64{}, map[string]float64{}, map[string]float64{}
	for _, s := range p.Sample {
		v := float64(s.Value[vi])
		total += v
		samples += s.Value[0]
		var frames []string // leaf first
		for _, loc := range s.Location {
			for _, ln := range loc.Line {
				if ln.Function != nil {
					frames = append(frames, ln.Function.Name)
				}
			}
		}
		if len(frames) == 0 {
			flat[catOther] += v
			continue
		}
		leaf[frames[0]] += v
		flat[categorize(frames)] += v
		seen := map[string]bool{}
		for _, f := range frames {
			for _, layer := range []string{catPgx, catStrategy, catGenerator, mechPgxTimer, mechIdleSearch} {
				if !seen[layer] && inLayer(layer, f) {
					seen[layer] = true
					inside[layer] += v
				}
			}
		}
	}
	if total == 0 {
		return &clientProfile{}, nil
	}
	out := &clientProfile{Samples: samples}
	out.Categories = shares(flat, total, 0)
	out.Inside = shares(inside, total, 0)
	out.Top = shares(leaf, total, 8)
	return out, nil
}

// categorize picks the category of one sample from its frames (leaf first).
func categorize(frames []string) string {
	has := func(prefixes ...string) bool {
		for _, f := range frames {
			for _, p := range prefixes {
				if strings.HasPrefix(f, p) {
					return true
				}
			}
		}
		return false
	}
	leaf := frames[0]
	switch {
	case has("internal/poll.(*FD).Read", "internal/poll.(*FD).Write", "net.(*conn).Read", "net.(*conn).Write"):
		return catSocket
	case has("runtime.gcBgMarkWorker", "runtime.mallocgc", "runtime.bgsweep", "runtime.gcStart", "runtime.GC"):
		return catGC
	case strings.HasPrefix(leaf, "runtime.") || strings.HasPrefix(leaf, "internal/runtime/") || strings.HasPrefix(leaf, "syscall."):
		return catRuntime
	case inLayer(catPgx, leaf):
		return catPgx
	case inLayer(catGenerator, leaf):
		return catGenerator
	case inLayer(catStrategy, leaf):
		return catStrategy
	}
	return catOther
}

// inLayer reports whether function f belongs to a layer of the client.
func inLayer(layer, f string) bool {
	switch layer {
	case catPgx:
		return strings.HasPrefix(f, "github.com/jackc/")
	case catGenerator:
		return strings.HasPrefix(f, module+"bench.") || strings.HasPrefix(f, "github.com/HdrHistogram/")
	case catStrategy:
		return strings.HasPrefix(f, module) && !strings.HasPrefix(f, module+"bench.") && !strings.HasPrefix(f, module+"cmd/")
	case mechPgxTimer:
		return strings.HasSuffix(f, "pgconn.(*PgConn).enterPotentialWriteReadDeadlock") || strings.HasSuffix(f, "pgconn.(*PgConn).exitPotentialWriteReadDeadlock")
	case mechIdleSearch:
		return f == "runtime.findRunnable"
	}
	return false
}

// shares turns amounts into shares of total, largest first (name breaks
// ties); n > 0 keeps the n largest.
func shares(m map[string]float64, total float64, n int) []share {
	out := make([]share, 0, len(m))
	for k, v := range m {
		out = append(out, share{Name: k, Share: v / total})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Share != out[j].Share {
			return out[i].Share > out[j].Share
		}
		return out[i].Name < out[j].Name
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}
