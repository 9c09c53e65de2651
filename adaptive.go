package bulkhead

import "time"

// adaptive moves a budget's limit between floor and ceil, as TCP Vegas does:
// from each window's mean hold and the lowest one (no queueing in the
// database) it estimates the operations queued there, limit·(1 − lowest/mean).
// It grows the limit by one below a third while callers wanted more, and
// shrinks it by one above one. A growth after which half an operation queued
// and the throughput rose by less than a quarter of what one more operation
// could bring is undone, and not tried again for 4·probeEvery windows, twice
// as many after each such undo in a row, up to 32·probeEvery, even across a
// visit to the floor: longer work does not give the database more cores. It
// is judged only on a window in which callers waited, or were refused, at
// every completion: otherwise the throughput measured is the callers'
// arrivals, and the growth is kept.
// Every probeEvery windows, unless one of them read under a third, one runs
// at the floor to measure the lowest hold again. Guarded by the budget's mutex.
type adaptive struct {
	floor, ceil int

	n       int           // completions in the window
	sum     time.Duration // their hold times
	start   time.Time     // when the window began; zero: unknown
	wanted  bool          // callers waited or were refused during the window
	dry     bool          // a completion of the window found no caller waiting, nor refused since the one before
	refused bool          // a caller was refused since the last completion

	low       time.Duration // the lowest window mean since the last probe; 0: none
	windows   int           // windows since the last probe
	confirmed bool          // a window since the last probe read under a third queued
	resume    int           // during a probe, the limit to return to; 0: none
	before    float64       // the throughput (per second) of the window before a growth; 0: none
	top       int           // the limit a growth undone tried, not tried again for blocked windows; 0: none
	blocked   int           // windows left before top may be tried again
	backoff   int           // the last undo's blocked windows; 0 once a growth is kept
}

// want records a caller refused (in dry-run, one that would have waited).
func (a *adaptive) want() {
	a.wanted, a.refused = true, true
}

// probeEvery is how many windows pass between two probes of the lowest hold.
const probeEvery = 32

// observe adds the hold time of one operation run under limit b, completed at
// now; waited reports whether callers wait now. At a window's end it returns
// the limit to put in force, and true if it differs from b.
func (a *adaptive) observe(held time.Duration, b int, waited bool, now time.Time) (int, bool) {
	a.n++
	a.sum += held
	busy := waited || a.refused
	a.wanted, a.dry, a.refused = a.wanted || busy, a.dry || !busy, false
	if a.n < max(8, 4*b) {
		return b, false
	}
	mean := a.sum / time.Duration(a.n)
	var rate float64
	if el := now.Sub(a.start); !a.start.IsZero() && el > 0 {
		rate = float64(a.n) / el.Seconds()
	}
	wanted, dry, before := a.wanted, a.dry, a.before
	a.n, a.sum, a.wanted, a.dry, a.before, a.start = 0, 0, false, false, 0, now
	a.windows++
	if a.blocked > 0 {
		a.blocked--
	}
	if a.blocked == 0 {
		a.top = 0
	}
	if b <= a.floor {
		a.low, a.windows, a.confirmed = mean, 0, false
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
		a.windows = 0
		if !a.confirmed {
			a.resume = b
			return a.floor, a.floor != b
		}
		a.confirmed = false
	}
	undo := before > 0 && !dry && queued > 0.5 && b > a.floor && rate < before*(float64(b)-0.75)/float64(b-1)
	if before > 0 && !undo {
		a.backoff = 0 // the growth is kept
	}
	nb := b
	switch {
	case undo: // the growth queued work and won little throughput
		a.backoff = min(max(2*a.backoff, 4*probeEvery), 32*probeEvery)
		nb, a.top, a.blocked = b-1, b, a.backoff
	case queued > 1 && b > a.floor:
		nb = b - 1
	case queued < 1.0/3 && wanted && b < a.ceil && (a.top == 0 || b+1 < a.top):
		nb, a.before = b+1, rate
	}
	return nb, nb != b
}
