package pgtest

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LongestTimeoutSet is the longest lock_timeout, statement_timeout or
// transaction_timeout that a query sent on p (by OpenPool, Pools or DB)
// has set so far, by SET, SET LOCAL or set_config; 0 when none has. A
// check that holds a lock while a strategy's request waits for it holds it
// longer than this, so that a strategy which gives up at its own timeout
// and answers as if it had tried (SOLD_OUT) is seen doing it, whatever the
// timeout (strategytest's wait-outlasts-timeouts check). A timeout set
// outside the pool's queries (a pool of the strategy's own, a role's
// settings) is not seen here.
func LongestTimeoutSet(p *pgxpool.Pool) time.Duration {
	if tr, ok := tracers.Load(p); ok {
		return time.Duration(tr.(*timeoutTracer).longest.Load())
	}
	return 0
}

// tracers maps each pool OpenPool opened to its tracer.
var tracers sync.Map

// timeoutTracer is a pgx.QueryTracer and pgx.BatchTracer that reads the
// timeouts the queries set. It only reads the text (and, for a
// placeholder, the arguments): a query that mentions no timeout costs one
// substring search.
type timeoutTracer struct{ longest atomic.Int64 }

func (tr *timeoutTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	tr.see(data.SQL, data.Args)
	return ctx
}

func (tr *timeoutTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *timeoutTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if data.Batch != nil {
		for _, q := range data.Batch.QueuedQueries {
			tr.see(q.SQL, q.Arguments)
		}
	}
	return ctx
}

func (tr *timeoutTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (tr *timeoutTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// timeoutSetting finds a timeout's name and the value given it:
// "SET LOCAL lock_timeout = '5s'", "SET statement_timeout TO 5000",
// "set_config('lock_timeout', '2 s', true)" and "set_config('lock_timeout',
// $1, true)" (the value then comes from the arguments).
var timeoutSetting = regexp.MustCompile(`(?i)(?:lock|statement|transaction)_timeout['"]?\s*(?:=|\bto\b|,)\s*(?:'\s*([0-9.]+)\s*([a-z]*)\s*'|([0-9.]+)\s*([a-z]*)|\$(\d+))`)

func (tr *timeoutTracer) see(sql string, args []any) {
	if !strings.Contains(sql, "_timeout") && !strings.Contains(sql, "_TIMEOUT") {
		return
	}
	for _, m := range timeoutSetting.FindAllStringSubmatch(sql, -1) {
		num, unit := m[1]+m[3], m[2]+m[4]
		if m[5] != "" {
			i, _ := strconv.Atoi(m[5])
			if i < 1 || i > len(args) {
				continue
			}
			num, unit = splitValue(args[i-1])
		}
		if d := settingDuration(num, unit); d > time.Duration(tr.longest.Load()) {
			tr.longest.Store(int64(d))
		}
	}
}

// splitValue reads an argument given to a timeout: a number (ms) or a
// string such as "5s".
func splitValue(arg any) (num, unit string) {
	var s string
	switch v := arg.(type) {
	case string:
		s = v
	case int, int32, int64, float64:
		s = strings.TrimSpace(strconv.FormatFloat(toFloat(v), 'f', -1, 64))
	case time.Duration:
		return strconv.FormatInt(v.Milliseconds(), 10), "ms"
	default:
		return "", ""
	}
	s = strings.TrimSpace(s)
	i := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		return s, ""
	}
	return s[:i], strings.TrimSpace(s[i:])
}

func toFloat(v any) float64 {
	switch n := v.(type) {
	case int:
		return float64(n)
	case int32:
		return float64(n)
	case int64:
		return float64(n)
	case float64:
		return n
	}
	return 0
}

// settingDuration is a timeout setting's value as PostgreSQL reads it:
// milliseconds when it has no unit.
func settingDuration(num, unit string) time.Duration {
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f <= 0 {
		return 0
	}
	per := map[string]time.Duration{"": time.Millisecond, "us": time.Microsecond, "ms": time.Millisecond, "s": time.Second, "min": time.Minute, "h": time.Hour, "d": 24 * time.Hour}[strings.ToLower(unit)]
	if per == 0 {
		return 0
	}
	return time.Duration(f * float64(per))
}
