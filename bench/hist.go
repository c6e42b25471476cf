package bench

import (
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Latencies are recorded in microseconds from 1 µs to 60 s with three
// significant digits: a recorded value is within 0.1% of the true one.
const (
	histMin    = 1
	histMax    = int64(60 * time.Second / time.Microsecond)
	histDigits = 3
)

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(histMin, histMax, histDigits) }

// record adds d to h, clamped into the trackable range, and reports whether
// it had to clamp (a latency beyond 60 s counts as 60 s).
func record(h *hdrhistogram.Histogram, d time.Duration) (clamped bool) {
	us := int64(d / time.Microsecond)
	switch {
	case us < histMin:
		us = histMin
	case us > histMax:
		us, clamped = histMax, true
	}
	_ = h.RecordValue(us) // in range by construction
	return clamped
}

// Quantiles are read from a merged histogram, never averaged across
// workers or trials. Values are milliseconds.
type Quantiles struct {
	N    int64   `json:"n"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`
}

func quantiles(h *hdrhistogram.Histogram) Quantiles {
	if h == nil || h.TotalCount() == 0 {
		return Quantiles{}
	}
	ms := func(us int64) float64 { return float64(us) / 1000 }
	return Quantiles{
		N:    h.TotalCount(),
		P50:  ms(h.ValueAtQuantile(50)),
		P90:  ms(h.ValueAtQuantile(90)),
		P99:  ms(h.ValueAtQuantile(99)),
		Max:  ms(h.Max()),
		Mean: h.Mean() / 1000,
	}
}

// merge adds every histogram of from into into (allocating it if nil).
func merge(into *hdrhistogram.Histogram, from ...*hdrhistogram.Histogram) *hdrhistogram.Histogram {
	for _, h := range from {
		if h == nil {
			continue
		}
		if into == nil {
			into = newHist()
		}
		into.Merge(h)
	}
	return into
}
