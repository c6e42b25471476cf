package service_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/pgtest"
	"github.com/reservebench/reservebench/redislock"
	"github.com/reservebench/reservebench/redistest"
	"github.com/reservebench/reservebench/service"
	"github.com/reservebench/reservebench/strategy"
)

// TestBusyIs503: a strategy's BUSY (here redislock's Redis lock, held by
// someone else past the strategy's wait bound) is answered 503 BUSY with
// Retry-After, not 500 UNKNOWN: BUSY promises that nothing was written, so
// the client may send the same key again without a lookup. The lookup
// shows nothing was written; once the lock is free, the same key is HELD.
func TestBusyIs503(t *testing.T) {
	ctx := context.Background()
	db, _ := pgtest.Pools(t)
	rs := redistest.New(t)
	sku := fmt.Sprintf("sku-busy-%d", time.Now().UnixNano())
	dep, err := redislock.Open(ctx, strategy.Config{DB: db, Stock: []strategy.Stock{{SKU: sku, Total: 1}},
		Resources: map[strategy.Resource]string{strategy.Redis: rs.Addr()}}, redislock.Options{Wait: 50 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = dep.Close() })
	gate, err := admission.New(dep.Node(0), admission.Limits{InFlight: 1, RetryAfter: 2 * time.Second})
	require.NoError(t, err)
	svc, err := service.New(service.Config{Strategy: dep.Node(0), Name: redislock.Name, Admission: gate})
	require.NoError(t, err)
	base := listen(t, svc)

	rdb, err := rs.Client()
	require.NoError(t, err)
	defer rdb.Close()
	lock := "reservebench:redislock:lock:" + sku
	require.NoError(t, rdb.Set(ctx, lock, "another-holder", time.Minute).Err())

	body := fmt.Sprintf(`{"request_key":"req-busy","user":"user-busy","sku":%q,"ttl_ms":60000}`, sku)
	r := do(t, http.MethodPost, base+"/reserve", "application/json", body)
	require.Equal(t, http.StatusServiceUnavailable, r.code, "%v", r.body)
	require.Equal(t, "BUSY", r.body["outcome"], "%v", r.body)
	require.Equal(t, "2", r.retryAfter)
	require.EqualValues(t, 0, svc.Stats().Unknown)
	look := do(t, http.MethodGet, base+"/reservations/req-busy", "", "")
	require.Equal(t, http.StatusNotFound, look.code, "BUSY wrote nothing: %v", look.body)

	require.NoError(t, rdb.Del(ctx, lock).Err())
	again := do(t, http.MethodPost, base+"/reserve", "application/json", body)
	require.Equal(t, http.StatusCreated, again.code, "%v", again.body)
	require.Equal(t, "HELD", again.body["outcome"])
}
