package service

import (
	"context"
	"net/http"

	"github.com/reservebench/reservebench/strategy"
)

// lookup answers GET /reservations/{request_key}: 200 with the committed
// reservation, 404 NOT_FOUND. NOT_FOUND means nothing is committed now; a
// reservation still in flight may commit later (seed 000, C28-06).
func (s *Service) lookup(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("request_key")
	if err := checkKey(key); err != nil {
		s.refuseInput(w, err)
		return
	}
	var res strategy.Reservation
	var err error
	if !s.admitted(w, r, func(ctx context.Context) { res, err = s.cfg.Strategy.Lookup(ctx, key) }) {
		return
	}
	s.writeReservation(w, key, res, err, answer{})
}

// writeReservation answers with a reservation's current state.
func (s *Service) writeReservation(w http.ResponseWriter, key string, res strategy.Reservation, err error, body answer) {
	switch {
	case err != nil:
		s.unknownOutcome(w, err.Error())
	case res.Status == strategy.StatusNotFound:
		body.Status = string(strategy.StatusNotFound)
		body.Error = "no committed reservation has request_key " + key + " (one still in flight may commit later)"
		s.write(w, http.StatusNotFound, body)
	default:
		body.Status = string(res.Status)
		body.Reservation = reservationOf(res)
		code := http.StatusOK
		if (body.Confirmed != nil && !*body.Confirmed) || (body.Units != nil && *body.Units == 0) {
			code = http.StatusConflict // the transition did not move the row
		}
		s.write(w, code, body)
	}
}

// confirm answers POST /reservations/{request_key}/confirm: 200 when this
// call moved HELD to CONFIRMED (before expiry), 409 with the current
// status when it did not, 404 when there is no such reservation.
func (s *Service) confirm(w http.ResponseWriter, r *http.Request) {
	c, ok := s.cfg.Strategy.(strategy.Confirmer)
	if !ok {
		s.notSupported(w, "confirm", "strategy.Confirmer")
		return
	}
	s.transition(w, r, func(ctx context.Context, key string) (answer, error) {
		moved, err := c.Confirm(ctx, key, strategy.ConfirmBeforeExpiry)
		return answer{Confirmed: &moved}, err
	})
}

// release answers POST /reservations/{request_key}/release: 200 with units
// 1 when this call gave the unit back, 409 with units 0 and the current
// status when it did not (already released, expired, confirmed).
func (s *Service) release(w http.ResponseWriter, r *http.Request) {
	rel, ok := s.cfg.Strategy.(strategy.Releaser)
	if !ok {
		s.notSupported(w, "release", "strategy.Releaser")
		return
	}
	s.transition(w, r, func(ctx context.Context, key string) (answer, error) {
		units, err := rel.Release(ctx, key)
		return answer{Units: &units}, err
	})
}

// transition runs one transition and the lookup of the row's state after
// it, in one admission slot.
func (s *Service) transition(w http.ResponseWriter, r *http.Request, move func(ctx context.Context, key string) (answer, error)) {
	key := r.PathValue("request_key")
	if err := checkKey(key); err != nil {
		s.refuseInput(w, err)
		return
	}
	var body answer
	var res strategy.Reservation
	var err error
	if !s.admitted(w, r, func(ctx context.Context) {
		if body, err = move(ctx, key); err == nil {
			res, err = s.cfg.Strategy.Lookup(ctx, key)
		}
	}) {
		return
	}
	s.writeReservation(w, key, res, err, body)
}

func (s *Service) notSupported(w http.ResponseWriter, what, iface string) {
	name := s.cfg.Name
	if name == "" {
		name = "this strategy"
	}
	s.write(w, http.StatusNotFound, answer{Outcome: OutcomeNotSupported,
		Error: name + " cannot " + what + " reservations (it does not implement " + iface + ")"})
}
