package report

import (
	"math"
	"sort"
)

// Summary describes a set of samples: the median, the extremes and the
// quartiles. With the few samples a VM benchmark can afford, min and max
// say more than the quartiles; both are kept.
type Summary struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Q1     float64 `json:"q1"`
	Q3     float64 `json:"q3"`
}

// summarize computes the Summary of samples; NaNs (failed samples) are
// left out. No samples give a zero Summary with N 0.
func summarize(samples []float64) Summary {
	s := make([]float64, 0, len(samples))
	for _, v := range samples {
		if !math.IsNaN(v) {
			s = append(s, v)
		}
	}
	if len(s) == 0 {
		return Summary{}
	}
	sort.Float64s(s)
	return Summary{
		N:      len(s),
		Median: quantile(s, 0.5),
		Min:    s[0],
		Max:    s[len(s)-1],
		Q1:     quantile(s, 0.25),
		Q3:     quantile(s, 0.75),
	}
}

// median is the middle of samples (the mean of the two middle ones for an
// even count); NaN when there are none.
func median(samples []float64) float64 {
	s := summarize(samples)
	if s.N == 0 {
		return math.NaN()
	}
	return s.Median
}

// quantile is the q-quantile of sorted samples, interpolating linearly
// between the closest ranks (R's type 7, numpy's default), so the 0.5
// quantile is the usual median.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 1 {
		return sorted[0]
	}
	h := q * float64(len(sorted)-1)
	lo := math.Floor(h)
	i := int(lo)
	if i+1 >= len(sorted) {
		return sorted[len(sorted)-1]
	}
	return sorted[i] + (h-lo)*(sorted[i+1]-sorted[i])
}

// pairs calls f on the i-th subject and reference samples, for
// measurements taken in pairs (A/B/A/B), leaving out pairs with a failed
// side.
func pairs(subject, reference []float64, f func(s, r float64)) {
	for i := 0; i < min(len(subject), len(reference)); i++ {
		if !math.IsNaN(subject[i]) && !math.IsNaN(reference[i]) {
			f(subject[i], reference[i])
		}
	}
}

// compare is the ratio (subject / reference) and the difference (subject -
// reference) of two series. Paired samples (taken alternately, so drift
// hits both alike) give one ratio per pair and their spread; otherwise the
// ratio is that of the medians, with N 1 and no spread.
func compare(subject, reference []float64, paired bool) (ratios, diffs Summary) {
	if paired && len(subject) == len(reference) {
		var rs, ds []float64
		pairs(subject, reference, func(s, r float64) {
			ds = append(ds, s-r)
			if r != 0 {
				rs = append(rs, s/r)
			}
		})
		return summarize(rs), summarize(ds)
	}
	ms, mr := median(subject), median(reference)
	if math.IsNaN(ms) || math.IsNaN(mr) || mr == 0 {
		return Summary{}, Summary{}
	}
	return summarize([]float64{ms / mr}), summarize([]float64{ms - mr})
}
