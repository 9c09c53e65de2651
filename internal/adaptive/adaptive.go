// Package adaptive is the limit Policy.Adaptive moves: the least number of
// operations at once that gets the most goodput, read from their holds.
package adaptive

import "time"

// Limit moves a budget's limit between floor and ceil to the least that
// gets the most goodput: work done within deadlines per second, by Little's
// law: with every permit busy, limit·Σbase/Σheld over a window of
// completions, each weighed by its class's base hold (its work with nothing
// queued, package estimate), so that which classes a window happened to hold
// does not move it; one cut off at its deadline did no work. A
// window is max(8, 4·limit) completions of operations granted their
// permits under the limit, and half as many in effect when their
// holds differ ((Σheld)²/Σheld²: a few long operations weigh as few); the
// limit moves only on a window in which at least three quarters of the
// completions found every permit held (otherwise the holds tell of a lower
// concurrency), and up only if callers waited or were refused during it;
// each move is judged on the first such window after it, against the mean
// of the windows since the move before, and no other move is made before:
// a step up is kept if it won at least upGain of what the added operations
// could bring, or if callers did not wait at every completion after it (it
// met their demand), a step down if it lost at most upGain; else it is
// undone and steps to that limit or beyond are not tried again
// for backoffMin windows, twice as many after each undo in a row, up to
// backoffMax. From the floor the limit doubles while each doubling wins
// slowGain of what it could (slow start); a doubling, there or from 1 to
// 2, is undone only if it lost goodput. Past it, the operations waiting
// inside the database, limit·(1 − mean(base/held)) with each hold against
// its class's base hold (the least estimate its class of work had,
// package estimate: its work with nothing queued; TCP Vegas's estimate,
// which a mix of short and long work does not fool), call for a step down
// above one and a half, a step up under a third, and otherwise a step up
// every exploreEvery windows, or at once after a step up that was kept:
// for work whose holds grow with the limit while goodput still rises.
// Guarded by the budget's mutex.
type Limit struct {
	Floor, Ceil int // the bounds it moves within; the caller sets them

	// The window being measured.
	n       int     // completions
	full    int     // of them, those that found every permit of the limit held
	work    float64 // of them, the base holds of those done within their deadline, in seconds
	held    float64 // their holds, in seconds
	held2   float64 // the squares of their holds
	unload  float64 // the good ones' base hold ÷ hold, summed: 1 each with nothing queued
	wanted  bool    // callers waited or were refused during the window
	demand  int     // completions that found callers waiting, or refused since the one before
	refused bool    // callers were refused since the last completion

	slow        bool    // slow start: the limit doubles while doubling pays
	from        int     // the limit before the move being judged; 0: none
	fromRate    float64 // the throughput at from
	rates       float64 // the throughputs of the busy windows since the last move, summed
	nRates      int     // and counted
	upTop       int     // a step up to it or above is blocked for upBlock windows (an undone one tried it)
	upBlock     int
	downBottom  int // likewise a step down to it or below
	downBlock   int
	upBackoff   int // the last undo's blocks; 0 once a step is kept
	downBackoff int
	climb       bool // the last step up was kept: the next is tried at once
	quiet       int  // windows since the last move

	last Move // the last move, and what it was made on
}

// Last returns the last move, and what it was made on.
func (a *Limit) Last() Move { return a.last }

// Move is a change of the limit and the signal it was made on
// (bulkhead.Move).
type Move struct {
	From, To int
	// Why: "slow start" (doubling while it pays), "queueing" (more than one
	// and a half operations wait inside the database), "room" (under a
	// third does), "explore" (a periodic step up), "climb" (a step up right
	// after one that was kept), "undone" (the step before won, or lost, too
	// much or too little), "kept" (the step before was judged and kept), or
	// "" before any.
	Why string
	// Queued is Vegas's estimate of the operations waiting inside the
	// database over the window the move was made on, B·(1 − mean(base/held))
	// with each hold's class's base hold; Gain is that window's goodput ÷
	// the one before the step judged (0: none judged).
	Queued, Gain float64
}

const (
	windowMin    = 8       // the fewest completions a window counts: fewer say more of the draw than of the limit
	windowPer    = 4       // and per permit of the limit, so that each permit turns over a few times
	effShare     = 0.5     // the share of a window's completions that must count in effect ((Σheld)²/Σheld²)
	busyShare    = 0.75    // the share of a window's completions that must find every permit held
	downQueued   = 1.5     // operations waiting inside the database above which the limit steps down (at 2 on 2 cores beside the client, 1.0-1.2 read)
	upQueued     = 1.0 / 3 // and under which it steps up: room that one more operation would use
	upGain       = 0.125   // a step up must win this share of what the added operations could bring; a step down may lose as much
	slowGain     = 0.125   // slow start goes on while a doubling wins this share of what it could
	exploreEvery = 8       // windows between two steps up the holds do not call for
	backoffMin   = 16      // windows a direction is blocked after an undo
	backoffMax   = 512     // the most it is blocked after undos in a row
)

// New returns a limit in slow start.
func New() *Limit { return &Limit{slow: true} }

// Want records a caller refused (in dry-run, one that would have waited).
func (a *Limit) Want() { a.wanted, a.refused = true, true }

// Observe adds the completion of one operation under limit b, granted its
// permit under limit from: it held its permits held, its class's base hold
// is base, 0 if it did no work (cut off at its deadline); full reports
// whether every permit of b was held as it completed, waited whether
// callers wait. Only operations granted under b count: one from before a
// move held them under the limit before. At a window's end it returns the
// limit to put in force, and true if it differs from b.
func (a *Limit) Observe(held, base time.Duration, from, b int, full, waited bool) (int, bool) {
	a.wanted = a.wanted || waited
	wanted := waited || a.refused
	a.refused = false
	if from != b {
		return b, false
	}
	if wanted {
		a.demand++
	}
	a.n++
	if full {
		a.full++
	}
	h := max(held, 1).Seconds()
	a.held += h
	a.held2 += h * h
	if base > 0 {
		a.work += min(base.Seconds(), h)
		a.unload += min(base.Seconds()/h, 1)
	}
	size := float64(max(windowMin, windowPer*b))
	if float64(a.n) < size || a.held*a.held < effShare*size*a.held2 {
		return b, false
	}
	rate := float64(b) * a.work / a.held
	queued := float64(b) * (1 - a.unload/float64(a.n))
	busy, wanted, met := float64(a.full) >= busyShare*float64(a.n), a.wanted, a.demand < a.n
	a.n, a.full, a.work, a.held, a.held2, a.unload, a.wanted, a.demand = 0, 0, 0, 0, 0, 0, false, 0
	a.upBlock, a.downBlock = max(a.upBlock-1, 0), max(a.downBlock-1, 0)
	a.quiet++

	if a.from != 0 && busy { // judge the move made on the window before
		from, gain := a.from, rate/a.fromRate
		a.from = 0
		step := float64(b-from) / float64(from) // the share the change could win; negative down
		a.last = Move{From: b, To: b, Why: "kept", Queued: queued, Gain: gain}
		// A step up after which the callers did not wait at every
		// completion met their demand: its goodput is their arrivals, kept.
		won := gain >= 1+upGain*step
		// A doubling (slow start's, or a step from 1 to 2) is judged on one
		// window, too few to tell a small gain from noise (a database
		// sharing its machine): it is undone only if it lost goodput.
		lost := !won && !((a.slow && b > from || b >= 2*from) && gain >= 1)
		if lost && !(b > from && met) {
			if b > from {
				a.upBackoff = min(max(2*a.upBackoff, backoffMin), backoffMax)
				a.upTop, a.upBlock, a.slow = b, a.upBackoff, false
				// A doubling that won what one step must: climb by steps.
				a.climb = b-from > 1 && gain >= 1+upGain/float64(from)
			} else {
				a.downBackoff = min(max(2*a.downBackoff, backoffMin), backoffMax)
				a.downBottom, a.downBlock = b, a.downBackoff
			}
			a.last, a.quiet = Move{From: b, To: from, Why: "undone", Queued: queued, Gain: gain}, 0
			a.rates, a.nRates = 0, 0
			return from, true
		}
		if b > from {
			a.upBackoff, a.climb = 0, won && !met // climb on only while demand is unmet
			a.slow = a.slow && gain >= 1+slowGain*step
		} else {
			a.downBackoff, a.climb = 0, false
		}
	}
	if !busy {
		return b, false
	}
	a.rates += rate
	a.nRates++
	up := wanted && b < a.Ceil && (a.upBlock == 0 || b+1 < a.upTop)
	down := b > a.Floor && (a.downBlock == 0 || b-1 > a.downBottom)
	nb, why := b, ""
	switch {
	case a.slow && up:
		nb, why = min(2*b, a.Ceil), "slow start"
		if a.upBlock > 0 {
			nb = min(nb, a.upTop-1)
		}
	case a.climb && up:
		nb, why = b+1, "climb"
	case queued > downQueued && down:
		nb, why = b-1, "queueing"
	case queued < upQueued && up:
		nb, why = b+1, "room"
	case a.quiet >= exploreEvery && up:
		nb, why = b+1, "explore"
	}
	a.climb = a.climb && why == "climb"
	a.slow = a.slow && why == "slow start"
	if nb == b {
		return b, false
	}
	// The move is judged against the mean of the windows since the last
	// one: the window that called for it is chosen by its holds, and its
	// throughput alone would favour the move.
	a.from, a.fromRate, a.quiet = b, a.rates/float64(a.nRates), 0
	a.rates, a.nRates = 0, 0
	a.last = Move{From: b, To: nb, Why: why, Queued: queued}
	return nb, true
}
