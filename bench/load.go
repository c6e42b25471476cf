package bench

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/reservebench/reservebench/admission"
	"github.com/reservebench/reservebench/strategy"
)

// Class is what became of one request.
type Class int

// The classes of answers. Only ClassHeld is goodput.
const (
	// ClassHeld: a new reservation (HELD).
	ClassHeld Class = iota
	// ClassRefused: a definite answer from the strategy other than HELD
	// (SOLD_OUT, USER_LIMIT, REPLAY, KEY_REUSED, BAD_REQUEST).
	ClassRefused
	// ClassShed: refused by admission before the database was touched.
	ClassShed
	// ClassError: an error; the outcome is unknown to the client.
	ClassError
	numClasses
)

// Load is the client side of a trial: who sends what, and when.
type Load struct {
	// Clients is the number of concurrent clients of a closed loop: each
	// sends its next request when the previous one is answered. An open
	// loop has no clients: see MaxInFlight.
	Clients int
	// Duration is the measured window. A request still in flight when it
	// closes is not counted in rates or latencies. In the closed loop it runs
	// to its end (at most one per client). In the open loop one still in
	// flight OpenGrace after the window is cancelled (Run.Interrupted): an
	// overloaded strategy can have up to MaxInFlight queued, and draining
	// them took up to 9 s a trial on 2 cores for nothing that is measured.
	Duration time.Duration
	// SKU is the SKU every request asks for, unless SKUs is set.
	SKU string
	// SKUs, when set, are the SKUs the requests spread over: each request
	// asks for SKUs[i] with i drawn from a Zipf distribution of exponent
	// Zipf (math/rand/v2: P(i) proportional to (1+i)^-Zipf), so SKUs[0]
	// is the most popular. Every client draws from a generator of its own,
	// seeded from Seed.
	SKUs []string
	Zipf float64
	// KeyBase makes the trial's keys unique: client c's n-th request (n from
	// 1) has key and user KeyBase + c*KeyStride + n, as the pgbench prologue
	// computes them, so both tools send requests of the same shape.
	KeyBase int64
	// TTL of every reservation (default strategy.TTLForever).
	TTL time.Duration

	// Rate > 0 makes the loop open, the model of k6's constant-arrival-rate
	// executor and of wrk2: requests are planned on a Poisson schedule of
	// Rate per second (exponential gaps, like pgbench --rate), and each is
	// sent at its planned time by a goroutine of its own, however many are
	// still in flight, up to MaxInFlight. So the schedule does not wait for
	// the system under test, and lateness (the send time after the planned
	// time) is only the generator's own timer; a request's latency is
	// measured from its planned time, so nothing is omitted. A request
	// planned while MaxInFlight are in flight is not sent, and counted
	// (Run.Dropped, k6's dropped iterations): the system was that far
	// behind.
	Rate float64
	// MaxInFlight caps the open loop's requests in flight; 0 means
	// DefaultMaxInFlight. The connections they share are the strategy's
	// pool, whose size the caller chooses.
	MaxInFlight int
	// LateLimit: an open-loop request that could only be sent more than this
	// after its planned time is skipped and counted as never sent (pgbench
	// --latency-limit does the same). 0: never skip.
	LateLimit time.Duration
	// Seed of the schedule.
	Seed uint64

	// Progress, when set, is called every ProgressEvery with the counts so far.
	Progress      func(Tick)
	ProgressEvery time.Duration
}

// KeyStride separates the key ranges of clients: at most 10^9 requests per
// client and trial.
const KeyStride = 1_000_000_000

// OpenGrace is how long the open loop lets requests still in flight after
// the window finish before it cancels them. Nothing answered after the
// window is counted, so the grace only spares the connections of requests
// about to finish.
const OpenGrace = 500 * time.Millisecond

// DefaultMaxInFlight is the open loop's cap on requests in flight when
// Load.MaxInFlight is 0: far more than any strategy here keeps busy at the
// rates the sweep plans, so reaching it means the system fell behind.
const DefaultMaxInFlight = 1024

// Key returns the request key (and user) of client c's n-th request.
func (l Load) Key(c int, n int64) string {
	return strconv.FormatInt(l.KeyBase+int64(c)*KeyStride+n, 10)
}

// Tick is a progress report, like a pgbench -P line.
type Tick struct {
	Elapsed  time.Duration
	Held     int64   // HELD answers so far
	Answers  int64   // answers of any class so far
	Interval float64 // seconds since the previous tick
	// HeldRate and MeanLatency cover the interval since the previous tick.
	HeldRate    float64
	MeanLatency time.Duration
}

// Run is what the client side saw in one trial.
type Run struct {
	Loop    string  `json:"loop"` // "closed" or "open"
	Clients int     `json:"clients"`
	Rate    float64 `json:"rate,omitempty"` // planned requests per second (open loop)
	// Window is the measured window in seconds.
	Window float64 `json:"window_s"`
	// Goodput is HELD answers per second in the window.
	Goodput float64 `json:"goodput"`
	// Throughput is answers of any class per second in the window.
	Throughput float64 `json:"throughput"`
	// Answers counted in the window, by class.
	Held    int64 `json:"held"`
	Refused int64 `json:"refused"`
	Shed    int64 `json:"shed"`
	Errors  int64 `json:"errors"`
	// Outcomes counts every answer in the window by outcome: the contract's
	// outcomes, "SHED:<reason>" and "ERROR".
	Outcomes map[string]int64 `json:"outcomes"`
	// HeldTotal counts every HELD, also those answered after the window
	// closed: it is what the database did, the denominator of cost per success.
	HeldTotal int64 `json:"held_total"`
	// AfterWindow counts requests answered after the window closed.
	AfterWindow int64 `json:"after_window"`
	// LastHeld is when (seconds from the start) the last HELD inside the
	// window was answered: on a stock that sells out, when it sold out.
	LastHeld float64 `json:"last_held_s"`
	// Latency of each class, from the merged per-client histograms.
	HeldLatency    Quantiles `json:"held_latency"`
	RefusedLatency Quantiles `json:"refused_latency"`
	ShedLatency    Quantiles `json:"shed_latency"`
	// Clamped latencies were beyond the histogram's 60 s range.
	Clamped  int64  `json:"clamped,omitempty"`
	FirstErr string `json:"first_error,omitempty"`

	// Open loop only.
	Planned     int64     `json:"planned,omitempty"`       // requests planned inside the window
	Sent        int64     `json:"sent,omitempty"`          // requests sent
	Skipped     int64     `json:"skipped,omitempty"`       // not sent: more than LateLimit late
	NeverSent   int64     `json:"never_sent,omitempty"`    // planned in the window, not sent before it closed
	Dropped     int64     `json:"dropped,omitempty"`       // not sent: MaxInFlight requests were in flight
	Late        int64     `json:"late,omitempty"`          // sent more than 1 ms after the planned time
	Lag         Quantiles `json:"schedule_lag"`            // send time minus planned time
	InFlightCap int       `json:"in_flight_cap,omitempty"` // MaxInFlight
	MaxInFlight int64     `json:"max_in_flight,omitempty"` // the most requests in flight at once
	// Interrupted were still in flight OpenGrace after the window closed and
	// were cancelled (k6's interrupted iterations): their outcome is unknown
	// and HeldTotal leaves them out.
	Interrupted int64 `json:"interrupted,omitempty"`

	// CPU is what the machine did during the window (Linux; zero elsewhere).
	CPU CPUUsage `json:"cpu"`

	hist [numClasses]*hdrhistogram.Histogram
	lag  *hdrhistogram.Histogram
}

// HeldHist returns the merged histogram of HELD latencies (µs), for merging
// across trials.
func (r *Run) HeldHist() *hdrhistogram.Histogram { return r.hist[ClassHeld] }

// RefusedHist returns the merged histogram of refused latencies (µs).
func (r *Run) RefusedHist() *hdrhistogram.Histogram { return r.hist[ClassRefused] }

// ShedHist returns the merged histogram of shed latencies (µs).
func (r *Run) ShedHist() *hdrhistogram.Histogram { return r.hist[ClassShed] }

// LagHist returns the merged histogram of schedule lags (µs, open loop).
func (r *Run) LagHist() *hdrhistogram.Histogram { return r.lag }

// MergeQuantiles reads quantiles from the merge of several histograms (of
// several trials): quantiles are never averaged.
func MergeQuantiles(hs ...*hdrhistogram.Histogram) Quantiles { return quantiles(merge(nil, hs...)) }

// clientRec is one client's record; nothing in it is shared.
type clientRec struct {
	hist     [numClasses]*hdrhistogram.Histogram
	lag      *hdrhistogram.Histogram
	n        [numClasses]int64
	outcomes map[string]int64
	heldAll  int64
	after    int64
	clamped  int64
	lastHeld time.Duration
	firstErr error

	sent, skipped, neverSent, dropped, late int64
}

func (c *clientRec) add(class Class, label string, lat time.Duration, inWindow bool, at time.Duration) {
	if class == ClassHeld {
		c.heldAll++
	}
	if !inWindow {
		c.after++
		return
	}
	c.n[class]++
	c.outcomes[label]++
	if class == ClassHeld && at > c.lastHeld {
		c.lastHeld = at
	}
	if class == ClassError {
		return
	}
	if c.hist[class] == nil {
		c.hist[class] = newHist()
	}
	if record(c.hist[class], lat) {
		c.clamped++
	}
}

// live are the counters the progress reporter reads while the run goes on.
type live struct {
	held, answers, latSum atomic.Int64 // latSum in µs
}

func classify(res strategy.Result, err error) (Class, string, time.Duration) {
	var rej *admission.RejectedError
	switch {
	case errors.As(err, &rej):
		return ClassShed, "SHED:" + rej.Reason.String(), rej.RetryAfter()
	case err != nil && res.Outcome == strategy.OutcomeBadRequest:
		return ClassRefused, string(res.Outcome), 0
	case err != nil:
		return ClassError, "ERROR", 0
	case res.Outcome == strategy.OutcomeHeld:
		return ClassHeld, string(res.Outcome), 0
	}
	return ClassRefused, string(res.Outcome), 0
}

// Drive runs the load against s and returns what the clients saw. It never
// fails: errors from s are counted (ClassError) and the first one kept.
func Drive(ctx context.Context, s strategy.Strategy, l Load) *Run {
	if l.TTL <= 0 {
		l.TTL = strategy.TTLForever
	}
	if l.Rate > 0 {
		return driveOpen(ctx, s, l)
	}
	if l.Clients < 1 {
		l.Clients = 1
	}
	recs := make([]*clientRec, l.Clients)
	for i := range recs {
		// The successes' histogram is made before the window: made at a
		// client's first answer, its 136 kB (zeroed, then faulted in) per
		// client came out of the window's CPU, 17 MB at 128 clients, on the
		// cores the server shares. The other classes are rarer.
		recs[i] = &clientRec{outcomes: map[string]int64{}}
		recs[i].hist[ClassHeld] = newHist()
	}
	var lv live
	startGate := make(chan struct{})
	var wg sync.WaitGroup
	var start, deadline time.Time
	for c := 0; c < l.Clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-startGate
			closedClient(ctx, s, l, c, recs[c], start, deadline, &lv)
		}()
	}
	cpu0 := readCPU()
	start = time.Now()
	deadline = start.Add(l.Duration)
	stopProgress := progress(l, &lv, start)
	close(startGate)
	cpuDone := cpuOfWindow(ctx, cpu0, deadline)
	wg.Wait()
	stopProgress()
	return collect(l, recs, l.Duration, <-cpuDone, 0)
}

// cpuOfWindow reads the machine's CPU counters when the window closes, not
// when the stragglers that finish after it do.
func cpuOfWindow(ctx context.Context, cpu0 cpuStat, deadline time.Time) <-chan CPUUsage {
	cpuDone := make(chan CPUUsage, 1)
	go func() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		cpuDone <- readCPU().since(cpu0)
	}()
	return cpuDone
}

// skuPicker chooses each request's SKU: always l.SKU, or a Zipf draw over
// l.SKUs from a generator of the caller's own.
type skuPicker struct {
	one  string
	many []string
	zipf *rand.Zipf
}

func newPicker(l Load, seed uint64) *skuPicker {
	if len(l.SKUs) == 0 {
		return &skuPicker{one: l.SKU}
	}
	r := rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d))
	return &skuPicker{many: l.SKUs, zipf: rand.NewZipf(r, l.Zipf, 1, uint64(len(l.SKUs)-1))}
}

func (p *skuPicker) next() string {
	if p.zipf == nil {
		return p.one
	}
	return p.many[p.zipf.Uint64()]
}

// ZipfShares returns the probability of each of n SKUs under the Zipf
// distribution Load.Zipf draws from (exponent s, v = 1): P(i) proportional
// to (1+i)^-s. The sweep sizes each SKU's stock from it.
func ZipfShares(n int, s float64) []float64 {
	out := make([]float64, n)
	sum := 0.0
	for i := range out {
		out[i] = math.Pow(float64(1+i), -s)
		sum += out[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

// driveOpen is the open loop (Load.Rate): one dispatcher walks the Poisson
// schedule and starts each request at its planned time on a goroutine of
// its own; a collector records the answers. Only the dispatcher touches the
// schedule counters, only the collector the answer histograms.
func driveOpen(ctx context.Context, s strategy.Strategy, l Load) *Run {
	limit := l.MaxInFlight
	if limit <= 0 {
		limit = DefaultMaxInFlight
	}
	rec := &clientRec{outcomes: map[string]int64{}, lag: newHist()}
	type answer struct {
		class    Class
		label    string
		lat      time.Duration
		inWindow bool
		at       time.Duration
		err      error
	}
	answers := make(chan answer, limit)
	var lv live
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for a := range answers {
			if a.class == ClassError && rec.firstErr == nil {
				rec.firstErr = a.err
			}
			rec.add(a.class, a.label, a.lat, a.inWindow, a.at)
			lv.answered(a.class, a.lat)
		}
	}()

	cpu0 := readCPU()
	start := time.Now()
	deadline := start.Add(l.Duration)
	sched := newSchedule(l.Rate, l.Seed, start)
	pick := newPicker(l, l.Seed)
	stopProgress := progress(l, &lv, start)
	cpuDone := cpuOfWindow(ctx, cpu0, deadline)
	slots := make(chan struct{}, limit)
	reqCtx, cancelRequests := context.WithCancel(ctx)
	defer cancelRequests()
	var inFlight, most, interrupted atomic.Int64
	var wg sync.WaitGroup
	var n int64
	for {
		planned, ok := sched.next(deadline)
		if !ok {
			break
		}
		if !sleepUntil(ctx, planned, deadline) {
			rec.neverSent++
			break
		}
		sendAt := time.Now()
		lag := sendAt.Sub(planned)
		if l.LateLimit > 0 && lag > l.LateLimit {
			rec.skipped++
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			rec.dropped++
			continue
		}
		rec.sent++
		if lag > time.Millisecond {
			rec.late++
		}
		record(rec.lag, lag)
		n++
		key := l.Key(0, n)
		req := strategy.Request{Key: key, User: key, SKU: pick.next(), TTL: l.TTL}
		if cur := inFlight.Add(1); cur > most.Load() {
			most.Store(cur) // only the dispatcher stores: no lost update
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := s.Reserve(reqCtx, req)
			t1 := time.Now()
			inFlight.Add(-1)
			<-slots
			if err != nil && reqCtx.Err() != nil && ctx.Err() == nil {
				interrupted.Add(1)
				return
			}
			class, label, _ := classify(res, err)
			answers <- answer{class: class, label: label, lat: t1.Sub(planned), inWindow: !t1.After(deadline), at: t1.Sub(start), err: err}
		}()
	}
	grace := time.AfterFunc(time.Until(deadline.Add(OpenGrace)), cancelRequests)
	wg.Wait()
	grace.Stop()
	close(answers)
	<-collected
	stopProgress()
	rec.neverSent += sched.drain(deadline)
	r := collect(l, []*clientRec{rec}, l.Duration, <-cpuDone, 0)
	r.InFlightCap, r.MaxInFlight, r.Interrupted = limit, most.Load(), interrupted.Load()
	return r
}

// collect merges the clients' records into a Run.
func collect(l Load, recs []*clientRec, window time.Duration, cpu CPUUsage, neverSent int64) *Run {
	r := &Run{Loop: "closed", Clients: l.Clients, Window: window.Seconds(), Outcomes: map[string]int64{}, CPU: cpu}
	if l.Rate > 0 {
		r.Loop, r.Rate = "open", l.Rate
		r.NeverSent = neverSent
	}
	var errs []error
	for _, c := range recs {
		r.Held += c.n[ClassHeld]
		r.Refused += c.n[ClassRefused]
		r.Shed += c.n[ClassShed]
		r.Errors += c.n[ClassError]
		for k, v := range c.outcomes {
			r.Outcomes[k] += v
		}
		r.HeldTotal += c.heldAll
		r.AfterWindow += c.after
		r.Clamped += c.clamped
		if s := c.lastHeld.Seconds(); s > r.LastHeld {
			r.LastHeld = s
		}
		if c.firstErr != nil {
			errs = append(errs, c.firstErr)
		}
		for i := range r.hist {
			r.hist[i] = merge(r.hist[i], c.hist[i])
		}
		r.lag = merge(r.lag, c.lag)
		r.Sent += c.sent
		r.Skipped += c.skipped
		r.NeverSent += c.neverSent
		r.Dropped += c.dropped
		r.Late += c.late
	}
	if len(errs) > 0 {
		r.FirstErr = errs[0].Error()
	}
	if l.Rate > 0 {
		r.Planned = r.Sent + r.Skipped + r.NeverSent + r.Dropped
	}
	r.Goodput = float64(r.Held) / r.Window
	r.Throughput = float64(r.Held+r.Refused+r.Shed+r.Errors) / r.Window
	r.HeldLatency = quantiles(r.hist[ClassHeld])
	r.RefusedLatency = quantiles(r.hist[ClassRefused])
	r.ShedLatency = quantiles(r.hist[ClassShed])
	r.Lag = quantiles(r.lag)
	return r
}

// DriveN sends exactly n requests through l.Clients concurrent clients in
// a closed loop (each client takes the next request number when its
// previous request is answered) and returns what they saw, the window being
// the time all n took. It is the shape testing.B wants (b.N operations);
// the sweep uses Drive, whose window is fixed.
func DriveN(ctx context.Context, s strategy.Strategy, l Load, n int) *Run {
	if l.Clients < 1 {
		l.Clients = 1
	}
	if l.TTL <= 0 {
		l.TTL = strategy.TTLForever
	}
	recs := make([]*clientRec, l.Clients)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for c := range recs {
		recs[c] = &clientRec{outcomes: map[string]int64{}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := recs[c]
			pick := newPicker(l, l.Seed+uint64(c))
			for {
				i := next.Add(1)
				if i > int64(n) {
					return
				}
				key := l.Key(c, i)
				t0 := time.Now()
				res, err := s.Reserve(ctx, strategy.Request{Key: key, User: key, SKU: pick.next(), TTL: l.TTL})
				t1 := time.Now()
				class, label, _ := classify(res, err)
				if class == ClassError && rec.firstErr == nil {
					rec.firstErr = err
				}
				rec.add(class, label, t1.Sub(t0), true, t1.Sub(start))
			}
		}()
	}
	wg.Wait()
	window := time.Since(start)
	return collect(l, recs, window, CPUUsage{}, 0)
}

// closedClient sends a request, waits for the answer, and sends the next,
// until the window closes. A request shed by admission is sent again (the
// same key: a refusal wrote nothing) after the Retry-After it was given;
// each send is timed on its own.
func closedClient(ctx context.Context, s strategy.Strategy, l Load, c int, rec *clientRec, start, deadline time.Time, lv *live) {
	pick := newPicker(l, l.Seed+uint64(c))
	for n := int64(1); ; n++ {
		key := l.Key(c, n)
		req := strategy.Request{Key: key, User: key, SKU: pick.next(), TTL: l.TTL}
		for {
			t0 := time.Now()
			if !t0.Before(deadline) || ctx.Err() != nil {
				return
			}
			res, err := s.Reserve(ctx, req)
			t1 := time.Now()
			class, label, retry := classify(res, err)
			if class == ClassError && rec.firstErr == nil {
				rec.firstErr = err
			}
			inWindow := !t1.After(deadline)
			rec.add(class, label, t1.Sub(t0), inWindow, t1.Sub(start))
			lv.answered(class, t1.Sub(t0))
			if class != ClassShed {
				break
			}
			if !sleepUntil(ctx, time.Now().Add(retry), deadline) {
				return
			}
		}
	}
}

// sleepUntil waits until t; it returns false when the window closes or the
// context ends first.
func sleepUntil(ctx context.Context, t, deadline time.Time) bool {
	if !t.Before(deadline) {
		t = deadline
	}
	d := time.Until(t)
	if d > 0 {
		timer := time.NewTimer(d)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return false
		}
	}
	return time.Now().Before(deadline) && ctx.Err() == nil
}

func (lv *live) answered(class Class, lat time.Duration) {
	lv.answers.Add(1)
	if class == ClassHeld {
		lv.held.Add(1)
		lv.latSum.Add(int64(lat / time.Microsecond))
	}
}

func progress(l Load, lv *live, start time.Time) (stop func()) {
	if l.Progress == nil || l.ProgressEvery <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(l.ProgressEvery)
		defer t.Stop()
		prev, prevHeld, prevLat := start, int64(0), int64(0)
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				held, lat := lv.held.Load(), lv.latSum.Load()
				iv := now.Sub(prev).Seconds()
				tick := Tick{Elapsed: now.Sub(start), Held: held, Answers: lv.answers.Load(), Interval: iv}
				if iv > 0 {
					tick.HeldRate = float64(held-prevHeld) / iv
				}
				if held > prevHeld {
					tick.MeanLatency = time.Duration((lat-prevLat)/(held-prevHeld)) * time.Microsecond
				}
				l.Progress(tick)
				prev, prevHeld, prevLat = now, held, lat
			}
		}
	}()
	return func() { close(done); <-finished }
}

// schedule is the open loop's plan: Poisson arrivals, handed out in order.
type schedule struct {
	mu    sync.Mutex
	rng   *rand.Rand
	rate  float64
	next_ time.Time
}

func newSchedule(rate float64, seed uint64, start time.Time) *schedule {
	s := &schedule{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), rate: rate}
	s.next_ = start.Add(s.gap())
	return s
}

func (s *schedule) gap() time.Duration {
	return time.Duration(s.rng.ExpFloat64() / s.rate * float64(time.Second))
}

// next returns the next planned time, or false when it is past the deadline.
func (s *schedule) next(deadline time.Time) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.next_
	if !t.Before(deadline) {
		return t, false
	}
	s.next_ = t.Add(s.gap())
	return t, true
}

// drain counts the planned times before the deadline that nobody took.
func (s *schedule) drain(deadline time.Time) int64 {
	var n int64
	for {
		if _, ok := s.next(deadline); !ok {
			return n
		}
		n++
	}
}
