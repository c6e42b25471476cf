package bench

import (
	"math"
	"sort"

	"gonum.org/v1/gonum/stat"
	"gonum.org/v1/gonum/stat/distuv"
)

// Summary describes one metric over repeated trials.
//
// Median is the point estimate the tables show: with a handful of trials on
// a noisy machine it is the one least moved by a single disturbed trial.
// Lo and Hi are a 95% confidence interval for the mean, mean ± t·s/√n with
// t the 97.5% quantile of Student's t with n-1 degrees of freedom (gonum's
// distuv.StudentsT), not 1.96·σ: for 5 trials t is 2.78, and a normal
// quantile would claim a 30% narrower interval than the data support. With
// one trial there is no interval (Lo = Hi = the value).
type Summary struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	Mean   float64 `json:"mean"`
	Lo     float64 `json:"ci95_lo"`
	Hi     float64 `json:"ci95_hi"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// Summarize computes a Summary of xs; NaNs and infinities are ignored. With
// no value left it returns the zero Summary (N == 0).
func Summarize(xs []float64) Summary {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return Summary{} // N == 0: no data (not NaN, which JSON cannot hold)
	}
	sort.Float64s(v)
	s := Summary{N: len(v), Min: v[0], Max: v[len(v)-1]}
	if n := len(v); n%2 == 1 {
		s.Median = v[n/2]
	} else {
		s.Median = (v[n/2-1] + v[n/2]) / 2
	}
	s.Mean = stat.Mean(v, nil)
	s.Lo, s.Hi = s.Mean, s.Mean
	if len(v) > 1 {
		sd := stat.StdDev(v, nil)
		t := distuv.StudentsT{Mu: 0, Sigma: 1, Nu: float64(len(v) - 1)}.Quantile(0.975)
		half := t * sd / math.Sqrt(float64(len(v)))
		s.Lo, s.Hi = s.Mean-half, s.Mean+half
	}
	return s
}

// HalfWidth is half the confidence interval, relative to the mean: 0.05
// means ±5%.
func (s Summary) HalfWidth() float64 {
	if s.Mean == 0 || math.IsNaN(s.Mean) {
		return math.NaN()
	}
	return (s.Hi - s.Lo) / 2 / math.Abs(s.Mean)
}
