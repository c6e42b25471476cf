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

// SKUs maps each SKU of a deployment to its total; it is read-only after
// Open.
type SKUs map[string]int

// NewSKUs is the SKUs of cfg.
func NewSKUs(cfg strategy.Config) SKUs {
	s := make(SKUs, len(cfg.Stock))
	for _, st := range cfg.Stock {
		s[st.SKU] = st.Total
	}
	return s
}

// CheckSKU returns strategy.UnknownSKU (a bad request) unless sku is one of
// the deployment's.
func (s SKUs) CheckSKU(sku string) error {
	if _, ok := s[sku]; !ok {
		return strategy.UnknownSKU(sku)
	}
	return nil
}

// Check is everything a strategy decides about a request without the
// database: the contract's field checks (Request.Validate), then CheckSKU.
// An error is a bad request: nothing may be written.
func (s SKUs) Check(req strategy.Request) error {
	if err := req.Validate(); err != nil {
		return err
	}
	return s.CheckSKU(req.SKU)
}
