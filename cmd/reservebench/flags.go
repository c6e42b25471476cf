package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/service"
	"github.com/reservebench/reservebench/strategy"
)

// UsageError is a command line the command refuses before it starts
// anything: it exits 2.
type UsageError struct {
	Flag   string // the flag at fault, or "" for the arguments
	Reason string
	Usage  string // the flags of the subcommand, printed after the error
}

func (e *UsageError) Error() string {
	if e.Flag == "" {
		return "usage: " + e.Reason
	}
	return fmt.Sprintf("usage: -%s: %s", e.Flag, e.Reason)
}

// errHelp is -h: the flags were printed, nothing else to do.
var errHelp = errors.New("help requested")

// serveConfig is a parsed serve command line.
type serveConfig struct {
	meta        strategy.Meta
	addr        string
	limits      admission.Limits
	workTimeout time.Duration
	timeouts    service.Timeouts
	stock       []strategy.Stock
	pool        int32
	attach      bool
	expireEvery time.Duration
	logEvery    time.Duration
	globalSlots int
}

func parseServe(args []string, stderr io.Writer) (*serveConfig, error) {
	fs := flag.NewFlagSet("reservebench serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var (
		addr        = fs.String("addr", "127.0.0.1:8080", "listen address; loopback only (127.0.0.0/8, ::1, localhost)")
		inflight    = fs.Int("inflight", 4, "admitted requests at once (the database sees at most this many from this process)")
		queue       = fs.Int("queue", 8, "requests that may wait for a slot; the next one is 503 REJECTED_QUEUE_FULL")
		wait        = fs.Duration("wait", 400*time.Millisecond, "longest wait for a slot; then 503 REJECTED_WAIT_TIMEOUT")
		retryAfter  = fs.Duration("retry-after", time.Second, "pause a refused client is told to take (Retry-After, whole seconds)")
		workTimeout = fs.Duration("work-timeout", service.DefaultWorkTimeout, "server-side deadline of an admitted request (no client can cancel it)")
		readTimeout = fs.Duration("read-timeout", service.DefaultTimeouts.Read, "longest a client may take to send a whole request (408)")
		stock       = fs.String("stock", "sku-lab-01=40", "stock to load: sku=total[,sku=total...]")
		pool        = fs.Int("pool", 0, "database connections (default: inflight + 2, for the expiry job and a spare; inflight more with -global-inflight)")
		attach      = fs.Bool("attach", false, "serve stock another serve process already loaded into the same database (needs RESERVEBENCH_DSN)")
		expireEvery = fs.Duration("expire-every", time.Second, "how often the expiry job runs, when the strategy has one (0: never)")
		logEvery    = fs.Duration("log-every", time.Minute, "how often a line of counters is logged (0: never)")
		globalSlots = fs.Int("global-inflight", 0, "also bound the requests of every serve process on this database together, with this many advisory-lock slots in it (0: off)")
	)
	usage := func() string {
		var b strings.Builder
		fmt.Fprintf(&b, "usage: reservebench serve [flags] STRATEGY\n\nSTRATEGY is one of: %s\n\nflags:\n", strings.Join(names(), ", "))
		fs.SetOutput(&b)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		return b.String()
	}
	bad := func(flagName, format string, a ...any) error {
		return &UsageError{Flag: flagName, Reason: fmt.Sprintf(format, a...), Usage: usage()}
	}
	// Flags may come before and after the strategy's name.
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(stderr, usage())
				return nil, errHelp
			}
			return nil, &UsageError{Reason: err.Error(), Usage: usage()}
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(positional) != 1 {
		return nil, &UsageError{Reason: fmt.Sprintf("want one STRATEGY, got %d argument(s) %q", len(positional), positional), Usage: usage()}
	}
	meta, ok := strategy.Lookup(positional[0])
	if !ok {
		return nil, &UsageError{Reason: fmt.Sprintf("unknown strategy %q (registered: %s)", positional[0], strings.Join(names(), ", ")), Usage: usage()}
	}
	cfg := &serveConfig{meta: meta, addr: *addr, workTimeout: *workTimeout, attach: *attach,
		expireEvery: *expireEvery, logEvery: *logEvery, globalSlots: *globalSlots}
	if err := checkLoopback(*addr); err != nil {
		return nil, bad("addr", "%v", err)
	}
	cfg.limits = admission.Limits{InFlight: *inflight, Queue: *queue, Wait: *wait, RetryAfter: *retryAfter}
	switch {
	case *inflight < 1:
		return nil, bad("inflight", "must be at least 1, got %d", *inflight)
	case *queue < 0:
		return nil, bad("queue", "must not be negative, got %d", *queue)
	case *wait <= 0 && *queue > 0:
		return nil, bad("wait", "must be positive when -queue is (%d), got %v", *queue, *wait)
	case *wait < 0:
		return nil, bad("wait", "must not be negative, got %v", *wait)
	case *retryAfter < 0:
		return nil, bad("retry-after", "must not be negative, got %v", *retryAfter)
	case *workTimeout <= 0:
		return nil, bad("work-timeout", "must be positive, got %v", *workTimeout)
	case *readTimeout <= 0:
		return nil, bad("read-timeout", "must be positive, got %v", *readTimeout)
	case *pool < 0:
		return nil, bad("pool", "must not be negative, got %d", *pool)
	case *expireEvery < 0:
		return nil, bad("expire-every", "must not be negative, got %v", *expireEvery)
	case *logEvery < 0:
		return nil, bad("log-every", "must not be negative, got %v", *logEvery)
	case *globalSlots < 0:
		return nil, bad("global-inflight", "must not be negative, got %d", *globalSlots)
	}
	cfg.timeouts = service.DefaultTimeouts
	cfg.timeouts.Read = *readTimeout
	cfg.pool = int32(*pool)
	if cfg.pool == 0 {
		cfg.pool = int32(*inflight + 2)
		if *globalSlots > 0 {
			cfg.pool += int32(*inflight) // a connection holds each slot
		}
	}
	st, err := parseStock(*stock)
	if err != nil {
		return nil, bad("stock", "%v", err)
	}
	cfg.stock = st
	return cfg, nil
}

func parseStock(s string) ([]strategy.Stock, error) {
	var out []strategy.Stock
	for _, part := range strings.Split(s, ",") {
		sku, total, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || sku == "" {
			return nil, fmt.Errorf("%q is not sku=total", part)
		}
		if err := (strategy.Request{Key: "k", User: "u", SKU: sku, TTL: time.Second}).Validate(); err != nil {
			return nil, fmt.Errorf("%q: %v", part, err)
		}
		for _, o := range out {
			if o.SKU == sku {
				return nil, fmt.Errorf("sku %q given twice", sku)
			}
		}
		n, err := strconv.Atoi(total)
		if err != nil || n < 0 || n > strategy.MaxTotal {
			return nil, fmt.Errorf("%q: total must be a whole number 0..%d", part, strategy.MaxTotal)
		}
		out = append(out, strategy.Stock{SKU: sku, Total: n})
	}
	return out, nil
}

// checkLoopback refuses an address a client on another machine could
// reach: the service has no authentication.
func checkLoopback(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("port %q is not a number 0..65535", port)
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback address (the service has no authentication)", host)
	}
	return nil
}

func names() []string {
	var out []string
	for _, m := range strategy.Registered() {
		out = append(out, m.Name)
	}
	sort.Strings(out)
	return out
}
