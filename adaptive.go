package bulkhead

import "time"

// adaptive moves a budget's limit between floor and ceil, as TCP Vegas does:
// from each window's mean hold and the lowest one (no queueing in the
// database) it estimates the operations queued there, limit·(1 − lowest/mean).
// It grows the limit by one below a third while callers wanted more, shrinks
// it by one above one, and undoes a growth above half, not retried for
// probeEvery windows. Every probeEvery windows, unless one of them read below
// a third, one runs at the floor to measure the lowest again. Guarded by the budget's mutex.
type adaptive struct {
	floor, ceil int

	n      int           // completions in the window
	sum    time.Duration // their hold times
	wanted bool          // callers waited or were refused during the window
	grew   bool          // the limit grew at the window's start

	low       time.Duration // the lowest window mean since the last probe; 0: none
	windows   int           // windows since the last probe
	resume    int           // during a probe, the limit to return to; 0: none
	top       int           // the most the limit may grow to until the next probe; 0: ceil
	confirmed bool          // a window since the last probe read below a third: the lowest holds
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
	wanted, grew := a.wanted, a.grew
	a.n, a.sum, a.wanted, a.grew = 0, 0, false, false
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
	queued := float64(b) * (1 - float64(a.low)/float64(mean))
	a.confirmed = a.confirmed || queued < 1.0/3
	if a.windows >= probeEvery {
		probe := !a.confirmed
		a.windows, a.top, a.confirmed = 0, 0, false
		if probe {
			a.resume = b
			return a.floor, a.floor != b
		}
	}
	nb := b
	switch {
	case grew && queued > 0.5 && b > a.floor: // the growth only queued work
		nb, a.top = b-1, b-1
	case queued > 1 && b > a.floor:
		nb = b - 1
	case queued < 1.0/3 && wanted && b < a.ceil && (a.top == 0 || b < a.top):
		nb, a.grew = b+1, true
	}
	return nb, nb != b
}
