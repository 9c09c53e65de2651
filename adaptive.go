package bulkhead

import "time"

// adaptive moves a budget's limit between floor and ceil, as TCP Vegas does:
// from each window's mean hold and the lowest one (no queueing in the
// database) it estimates the operations queued there, limit·(1 − lowest/mean),
// and grows the limit by one below a third while callers wanted more, or
// shrinks it by one above one. One window in every probeEvery runs at the
// floor to measure the lowest again. Guarded by the budget's mutex.
type adaptive struct {
	floor, ceil int

	n      int           // completions in the window
	sum    time.Duration // their hold times
	wanted bool          // callers waited or were refused during the window

	low     time.Duration // the lowest window mean since the last probe; 0: none
	windows int           // windows since the last probe
	resume  int           // during a probe, the limit to return to; 0: none
}

// probeEvery is how many windows pass between two probes of the lowest hold.
const probeEvery = 32

// observe adds the hold time of one operation run under limit b; waited
// reports whether callers wait now. At a window's end it returns the limit
// to put in force, and true if it differs from b.
func (a *adaptive) observe(held time.Duration, b int, waited bool) (int, bool) {
	a.n++
	a.sum += held
	a.wanted = a.wanted || waited
	if a.n < max(8, 4*b) {
		return b, false
	}
	mean := a.sum / time.Duration(a.n)
	wanted := a.wanted
	a.n, a.sum, a.wanted = 0, 0, false
	a.windows++
	if b <= a.floor {
		a.low, a.windows = mean, 0
	} else if a.low == 0 || mean < a.low {
		a.low = mean
	}
	if a.resume > 0 { // the probe window ended
		nb := min(max(a.resume, a.floor), a.ceil)
		a.resume = 0
		return nb, nb != b
	}
	if a.windows >= probeEvery {
		a.resume = b
		return a.floor, a.floor != b
	}
	queued := float64(b) * (1 - float64(a.low)/float64(mean))
	nb := b
	switch {
	case queued > 1 && b > a.floor:
		nb = b - 1
	case queued < 1.0/3 && wanted && b < a.ceil:
		nb = b + 1
	}
	return nb, nb != b
}
