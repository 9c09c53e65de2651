package bulkhead

import "time"

// adaptive moves a budget's limit between floor and ceil from the hold
// times of its operations, in the manner of TCP Vegas: it compares the
// mean hold of each window of completions with the lowest one (the hold
// without queueing inside the database) and reads from the ratio how many
// operations queue there, limit·(1 − lowest/mean). Fewer than a third of
// one, while callers wanted more (they waited or were refused), and the
// limit grows by one; more than one, and it shrinks by one.
//
// The lowest is measured again, as the work itself may have got longer or
// shorter, whenever the limit is at the floor, where the hold is by
// definition the one without queueing: one window in every probeEvery
// runs there, and the limit then returns to where it was. Rejections
// decide nothing else. Its state is guarded by the budget's mutex.
type adaptive struct {
	floor, ceil int

	n      int           // completions in the window
	sum    time.Duration // their hold times
	wanted bool          // callers waited or were refused during the window

	low     time.Duration // the lowest window mean since the last probe; 0: none
	windows int           // windows since the last probe
	resume  int           // during a probe, the limit to return to; 0: none
}

// probeEvery is how many windows pass between two probes of the lowest
// hold.
const probeEvery = 32

// observe adds the hold time of one operation that ran under limit b;
// waited reports whether callers wait now. At the end of a window it
// returns the limit to put in force and true if it differs from b.
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
