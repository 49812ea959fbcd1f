package bench

import (
	"slices"
	"time"
)

// durations is a sample of latencies.
type durations []time.Duration

// percentile returns the nearest-rank q-quantile (0 < q ≤ 1), or 0 for an
// empty sample. The sample is sorted in place.
func (d durations) percentile(q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	rank := int(q*float64(len(d)) + 0.999999)
	rank = min(max(rank, 1), len(d))
	return d[rank-1]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// rate is n events over d, per second (0 when d is not positive).
func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
