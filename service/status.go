package service

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Stats are the service's counters since it started: the gate and what
// happened to the requests it admitted or refused.
type Stats struct {
	Strategy string `json:"strategy"`
	// Limits of the admission.
	InFlightLimit int   `json:"in_flight_limit"`
	QueueLimit    int   `json:"queue_limit"`
	WaitMs        int64 `json:"wait_ms"`
	// Now.
	Running int       `json:"running"` // admitted calls in progress
	Waiting int       `json:"waiting"` // calls waiting for a slot
	Gate    GateStats `json:"gate"`
	// Admitted calls that returned, whatever their outcome.
	Finished int64 `json:"finished"`
	// ClientLeftRunning counts admitted calls whose client left before
	// the answer; each ran to its end all the same.
	ClientLeftRunning int64 `json:"client_left_running"`
	// ClientLeftQueued counts calls dropped because their client left
	// while they waited; none touched the database.
	ClientLeftQueued int64 `json:"client_left_queued"`
	// RefusedDraining counts calls refused because the service drains.
	RefusedDraining int64 `json:"refused_draining"`
	// Unknown counts answers whose outcome is unknown (500).
	Unknown int64 `json:"unknown"`
	// Answers counts every answer by outcome.
	Answers  map[string]int64 `json:"answers"`
	Draining bool             `json:"draining"`
}

// GateStats are admission.Stats with the status page's names.
type GateStats struct {
	Admitted          int64 `json:"admitted"`
	AdmittedAfterWait int64 `json:"admitted_after_wait"`
	RejectedQueueFull int64 `json:"rejected_queue_full"`
	RejectedTimeout   int64 `json:"rejected_wait_timeout"`
	RejectedCanceled  int64 `json:"rejected_canceled"`
	MaxInFlight       int64 `json:"max_in_flight"`
	MaxWaiting        int64 `json:"max_waiting"`
}

// Stats returns the counters. Each is read atomically; together they are a
// snapshot only when no request is running.
func (s *Service) Stats() Stats {
	l := s.cfg.Admission.Limits()
	return Stats{
		Strategy:      s.cfg.Name,
		InFlightLimit: l.InFlight, QueueLimit: l.Queue, WaitMs: l.Wait.Milliseconds(),
		Running:           int(s.running.Load()),
		Waiting:           s.cfg.Admission.Waiting(),
		Gate:              GateStats(s.cfg.Admission.Stats()),
		Finished:          s.finished.Load(),
		ClientLeftRunning: s.clientLeftRunning.Load(),
		ClientLeftQueued:  s.clientLeftQueue.Load(),
		RefusedDraining:   s.refusedDraining.Load(),
		Unknown:           s.unknown.Load(),
		Answers:           s.answers.snapshot(),
		Draining:          s.drainCtx.Err() != nil,
	}
}

// status answers GET /status with Stats (seed 004's /inspect). It reads no
// database and takes no admission slot, so it answers under overload.
func (s *Service) status(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s.Stats())
}

// String is the one-line summary the serve command logs every minute.
func (st Stats) String() string {
	var b strings.Builder
	g := st.Gate
	fmt.Fprintf(&b, "running %d, waiting %d; admitted %d (%d at once, %d after waiting); refused %d (queue full %d, wait timeout %d, client left while queued %d, draining %d)",
		st.Running, st.Waiting, g.Admitted+g.AdmittedAfterWait, g.Admitted, g.AdmittedAfterWait,
		g.RejectedQueueFull+g.RejectedTimeout+st.ClientLeftQueued+st.RefusedDraining, g.RejectedQueueFull, g.RejectedTimeout, st.ClientLeftQueued, st.RefusedDraining)
	fmt.Fprintf(&b, "; client left while running %d; max in flight %d, max waiting %d", st.ClientLeftRunning, g.MaxInFlight, g.MaxWaiting)
	for _, o := range answerOutcomes {
		if n := st.Answers[o]; n > 0 {
			fmt.Fprintf(&b, "; %s %d", o, n)
		}
	}
	return b.String()
}

// Timeouts of the HTTP server. They bound what admission cannot see: a
// client slow to send its headers or body, or slow to read the answer.
type Timeouts struct {
	ReadHeader time.Duration // the request line and headers
	Read       time.Duration // the whole request, body included (408)
	Idle       time.Duration // a kept-alive connection between requests
}

// DefaultTimeouts are the serve command's.
var DefaultTimeouts = Timeouts{ReadHeader: 2 * time.Second, Read: 5 * time.Second, Idle: time.Minute}

// Server returns an http.Server for the service with these timeouts. Its
// WriteTimeout covers the longest an answer can take: the read, the
// admission wait and the work.
func (s *Service) Server(t Timeouts) *http.Server {
	return &http.Server{
		Handler:           s,
		ReadHeaderTimeout: t.ReadHeader,
		ReadTimeout:       t.Read,
		WriteTimeout:      t.Read + s.cfg.Admission.Limits().Wait + s.cfg.WorkTimeout + 5*time.Second,
		IdleTimeout:       t.Idle,
		MaxHeaderBytes:    16 << 10,
	}
}
