package pgstrategy

import (
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/reservebench/reservebench/strategy"
)

// ScanReservation reads the reservation of key from a row of
// (user_id, sku, status, expires_at), the columns every strategy's lookup
// returns. No row: a reservation with Status strategy.StatusNotFound, and
// found false.
func ScanReservation(row pgx.Row, key string) (r strategy.Reservation, found bool, err error) {
	r.Key = key
	var status string
	err = row.Scan(&r.User, &r.SKU, &status, &r.ExpiresAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return strategy.Reservation{Key: key, Status: strategy.StatusNotFound}, false, nil
	case err != nil:
		return strategy.Reservation{}, false, err
	}
	r.Status = strategy.Status(status)
	return r, true, nil
}

// KnownKey answers a request whose key already has the reservation r:
// REPLAY when r is the request's (same user and SKU), else KEY_REUSED;
// either way with r in its current status.
func KnownKey(req strategy.Request, r strategy.Reservation) strategy.Result {
	if r.User != req.User || r.SKU != req.SKU {
		return strategy.Result{Outcome: strategy.OutcomeKeyReused, Reservation: r}
	}
	return strategy.Result{Outcome: strategy.OutcomeReplay, Reservation: r}
}
