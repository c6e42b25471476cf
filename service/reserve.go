package service

import (
	"context"
	"errors"
	"net/http"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/strategy"
)

// statusOf is the HTTP status of each outcome of Reserve (seed 000).
var statusOf = map[strategy.Outcome]int{
	strategy.OutcomeHeld:       http.StatusCreated,
	strategy.OutcomeReplay:     http.StatusOK,
	strategy.OutcomeSoldOut:    http.StatusConflict,
	strategy.OutcomeUserLimit:  http.StatusConflict,
	strategy.OutcomeKeyReused:  http.StatusUnprocessableEntity,
	strategy.OutcomeBadRequest: http.StatusBadRequest,
}

// The outcomes the service adds to the strategy's.
const (
	OutcomeQueueFull    = "REJECTED_QUEUE_FULL"
	OutcomeWaitTimeout  = "REJECTED_WAIT_TIMEOUT"
	OutcomeShuttingDown = "REJECTED_SHUTTING_DOWN"
	// OutcomeClientGone answers a request whose client left while it was
	// queued; nobody reads it.
	OutcomeClientGone = "REJECTED_CLIENT_GONE"
	// OutcomeUnknown: the strategy returned an error, so the reservation
	// may or may not be committed. GET the key, or send the same request
	// again.
	OutcomeUnknown      = "UNKNOWN"
	OutcomeNotFound     = "NOT_FOUND"
	OutcomeNotSupported = "NOT_SUPPORTED"
	// OutcomeNoSuchRoute and OutcomeMethodNotAllowed answer a request
	// the API has no endpoint for: nothing was read or written.
	OutcomeNoSuchRoute      = "NO_SUCH_ROUTE"
	OutcomeMethodNotAllowed = "METHOD_NOT_ALLOWED"
)

func (s *Service) reserve(w http.ResponseWriter, r *http.Request) {
	req, err := decodeReserve(w, r, s.cfg.MaxBody)
	if err != nil {
		s.refuseInput(w, err)
		return
	}
	var res strategy.Result
	var callErr error
	if !s.admitted(w, r, func(ctx context.Context) { res, callErr = s.cfg.Strategy.Reserve(ctx, req) }) {
		return
	}
	switch {
	case callErr == nil && res.Outcome == strategy.OutcomeBusy:
		s.refuseBusy(w)
	case callErr == nil:
		code, ok := statusOf[res.Outcome]
		if !ok {
			s.unknownOutcome(w, "the strategy answered an outcome the API does not know: "+string(res.Outcome))
			return
		}
		body := answer{Outcome: string(res.Outcome)}
		if res.Reservation.Key != "" {
			body.Reservation = reservationOf(res.Reservation)
		}
		s.write(w, code, body)
	case errors.Is(callErr, strategy.ErrBadRequest):
		// The strategy refused a request that passed Validate (an unknown
		// SKU): nothing was written.
		body := answer{Outcome: string(strategy.OutcomeBadRequest), Error: callErr.Error()}
		var re *strategy.RequestError
		if errors.As(callErr, &re) {
			body.Field = apiField[re.Field]
		}
		s.write(w, http.StatusBadRequest, body)
	default:
		s.unknownOutcome(w, callErr.Error())
	}
}

// admitted runs work inside an admission slot, with a context no client
// can cancel, and reports whether it ran. When it did not, the refusal has
// been answered (503) and nothing touched the database.
func (s *Service) admitted(w http.ResponseWriter, r *http.Request, work func(ctx context.Context)) bool {
	if s.drainCtx.Err() != nil {
		s.refusedDraining.Add(1)
		s.refuse(w, OutcomeShuttingDown)
		return false
	}
	// The wait is bounded by the client (it leaves: dropped) and by Drain.
	waitCtx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	stopDrain := context.AfterFunc(s.drainCtx, func() { cancel(errDraining) })
	defer stopDrain()
	release, err := s.cfg.Admission.Acquire(waitCtx)
	if err != nil {
		var rej *admission.RejectedError
		switch {
		case !errors.As(err, &rej):
			s.unknownOutcome(w, "admission: "+err.Error())
		case rej.Reason == admission.QueueFull:
			s.refuse(w, OutcomeQueueFull)
		case rej.Reason == admission.WaitTimeout:
			s.refuse(w, OutcomeWaitTimeout)
		case context.Cause(waitCtx) == errDraining:
			s.refusedDraining.Add(1)
			s.refuse(w, OutcomeShuttingDown)
		default:
			s.clientLeftQueue.Add(1)
			s.refuse(w, OutcomeClientGone)
		}
		return false
	}
	s.running.Add(1)
	// Admitted: finish it whatever the client does (seed 000). The client
	// leaving is only counted.
	stopWatch := context.AfterFunc(r.Context(), func() { s.clientLeftRunning.Add(1) })
	ctx, cancelWork := context.WithTimeout(context.WithoutCancel(r.Context()), s.cfg.WorkTimeout)
	func() {
		defer release()
		defer cancelWork()
		work(ctx)
	}()
	stopWatch()
	s.running.Add(-1)
	s.finished.Add(1)
	return true
}

var errDraining = errors.New("service: draining")
