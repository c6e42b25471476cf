package bench

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPUUsage is what the whole machine did during a window, from /proc/stat:
// client and server share the machine, so this is both of them (and
// anything else running). Zero where /proc/stat is missing.
type CPUUsage struct {
	// Busy is the average number of cores busy (user, nice, system, irq,
	// softirq, steal): 2.0 means both cores of a 2-core machine were busy
	// the whole window.
	Busy float64 `json:"cores_busy"`
	// CtxSwitches is the number of context switches, machine-wide.
	CtxSwitches int64 `json:"ctx_switches"`
	// Seconds is the window's length.
	Seconds float64 `json:"seconds"`
	// Client is the CPU time (user + system, seconds) of the client alone:
	// for Go, this process during the window (the load generator, pgx, the
	// strategy's Go code, the runtime); for pgbench, its process over its
	// whole run (connections, the window, and writing its log). With the
	// client's answers it says what each tool spends per answer on the
	// cores it shares with the server.
	Client float64 `json:"client_cpu_s"`
}

type cpuStat struct {
	at    time.Time
	busy  int64 // jiffies
	total int64
	ctxt  int64
	ncpu  int
	ok    bool
	self  time.Duration // this process's CPU time (getrusage)
}

// processCPU is this process's user + system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func readCPU() cpuStat {
	s := cpuStat{at: time.Now(), self: processCPU()}
	f, err := os.Open("/proc/stat")
	if err != nil {
		return s
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		switch fields[0] {
		case "cpu":
			// user nice system idle iowait irq softirq steal ...
			for i, f := range fields[1:] {
				if i >= 8 {
					break
				}
				v, _ := strconv.ParseInt(f, 10, 64)
				s.total += v
				if i != 3 && i != 4 { // idle, iowait
					s.busy += v
				}
			}
			s.ok = true
		default:
			if strings.HasPrefix(fields[0], "cpu") {
				s.ncpu++
			}
		case "ctxt":
			s.ctxt, _ = strconv.ParseInt(fields[1], 10, 64)
		}
	}
	return s
}

func (s cpuStat) since(before cpuStat) CPUUsage {
	if !s.ok || !before.ok {
		return CPUUsage{}
	}
	u := CPUUsage{CtxSwitches: s.ctxt - before.ctxt, Seconds: s.at.Sub(before.at).Seconds(), Client: (s.self - before.self).Seconds()}
	if total := s.total - before.total; total > 0 {
		n := s.ncpu
		if n == 0 {
			n = runtime.NumCPU()
		}
		u.Busy = float64(s.busy-before.busy) / float64(total) * float64(n)
	}
	return u
}
