package strategytest

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reservebench/reservebench/strategy"
)

// dstZone is a POSIX time zone, 5 h 45 min east of UTC like pgtest's
// databases, whose daylight saving time begins about 12 hours after now
// (for 60 days): a day-long TTL reserved now ends on the other side of
// the change. The zone is made up because the zones of the tz database
// change at fixed dates, and the kit runs on any day.
func dstZone(now time.Time) string {
	local := now.UTC().Add(5*time.Hour + 45*time.Minute + 12*time.Hour) // standard time, 12 h on
	if local.Month() == time.February && local.Day() == 29 {
		local = local.Add(24 * time.Hour) // POSIX "Jn" days never count February 29
	}
	start := julianDay(local)
	end := (start+59)%365 + 1
	return fmt.Sprintf("<+0545>-5:45<+0645>-6:45,J%d/%02d:%02d,J%d/%02d:%02d", start, local.Hour(), local.Minute(), end, local.Hour(), local.Minute())
}

// julianDay is t's POSIX Jn day: 1 to 365, February 29 never counted.
func julianDay(t time.Time) int {
	d := t.YearDay()
	if y := t.Year(); (y%4 == 0 && y%100 != 0 || y%400 == 0) && t.Month() > time.February {
		d--
	}
	return d
}

// dstTTLs are the TTLs checkTTLAcrossDST holds: past the change (12 h on)
// and a whole day.
var dstTTLs = []time.Duration{18 * time.Hour, strategy.MaxTTL}

// checkTTLAcrossDST: a TTL is a duration, not a count of calendar days or
// hours. PostgreSQL adds an interval's days in the session's time zone, so
// a strategy that turns 24 h into '1 day' (justify_hours, or a day column)
// ends a reservation 23 or 25 hours later when the zone changes to or from
// daylight saving time in between. pgtest's databases run in a zone
// without one (Asia/Kathmandu), so every other check passes such a
// strategy; here the deployment's sessions run in a zone whose daylight
// saving time begins 12 hours from now.
func checkTTLAcrossDST(t tester, meta strategy.Meta, db *pgxpool.Pool, rs map[strategy.Resource]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := db.Config().Copy()
	zone := dstZone(time.Now())
	cfg.ConnConfig.RuntimeParams["timezone"] = zone
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("a pool in time zone %q: %v", zone, err)
	}
	defer closeKitPool(pool)
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("a pool in time zone %q: %v", zone, err)
	}
	dep, _, _ := holdTTLs(ctx, t, meta, pool, rs, "dst", dstTTLs)
	dep.Close()
}
