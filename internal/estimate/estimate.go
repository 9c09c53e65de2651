// Package estimate learns how long operations hold a gate's permits, per
// class of work, and judges from it which would miss their deadlines.
package estimate

import (
	"hash/maphash"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// The hold estimates: how long an operation will hold its permits, learnt
// per class of work (a statement's text; a transaction's workload and the
// time it was given), from the holds measured (the gate's admission.go says
// which). A class's estimate is the lower median of its last HoldSamples
// holds, which one outlier cannot lift; holds cut off at their deadline are
// lower bounds of the work: after two in a row, the second begun after the
// first was cut off, the estimate is at least the longest of those since
// the last complete hold (one alone is an outlier; so is one stall that
// cuts off every operation running). It refuses work only on fresh
// evidence: it is not used once its last hold is older than StaleAfter (or
// four times itself), and while it refuses a class's work one operation
// goes as a probe ProbeGap after the last one ended (or its deadline came);
// a probe that held less than the estimate restarts it. So a database fast
// again is believed within ProbeGap, the last probe's deadline and the next
// probe's own hold.

const (
	// HoldSamples is how many holds of a class its estimate is the median of.
	HoldSamples = 8
	// ClassSets×2 classes are kept, each set's least recently measured out.
	ClassSets = 128
	// ProbeGap is how soon a class whose work is refused lets one operation
	// go: a probe costs one operation's work, and waiting longer to send it
	// costs every refused one once the database is fast again.
	ProbeGap = 250 * time.Millisecond
	// StaleAfter is the least age of a class's last hold past which its
	// estimate refuses nothing; StaleHolds, the age in estimates.
	StaleAfter = time.Second
	StaleHolds = 4
)

// Key names a class: the statement's text for an autocommit statement
// or query; for a transaction (text ""), the workload and the time its
// caller left it, to within a factor of two.
type Key struct {
	Kind     uint8 // the operation's kind (bulkhead.Kind)
	Within   uint8 // LeftClass; 0 for a statement, or no deadline
	Workload string
	Text     string
}

// LeftClass is the class of a transaction left d as it arrives: the power of
// two of the milliseconds it has, so that the transactions given 100 ms are
// not judged by those given 3 s, which alone get through while the short
// ones are refused.
func LeftClass(d time.Duration) uint8 {
	return uint8(bits.Len64(uint64(max(d, 0)/time.Millisecond))) + 1
}

// class is one class of work and its holds; guarded by its set's mutex.
type class struct {
	key      Key
	gen      uint64                     // bumped each time the slot takes another class; 0: empty
	holds    [HoldSamples]time.Duration // the last holds, in a ring
	n, next  int
	cut      time.Duration // the longest of the holds cut off at their deadline since the last complete one
	cuts     int           // how many were cut off since the last complete one, each begun after the one before was
	cutAt    time.Time     // when the last one counted in cuts was cut off
	est      time.Duration // the lower median of holds, or cut if longer after two cut off in a row; 0: none measured
	base     time.Duration // the least est once HoldSamples/2 holds were measured: its work with nothing queued
	last     time.Time     // when the last hold was measured
	since    time.Time     // holds of operations started before it tell nothing (a restart)
	refusing time.Time     // since when its work is refused; zero: it is not
	probeAt  time.Time     // while refusing, when the next probe may go
}

type classSet struct {
	mu   sync.Mutex
	ways [2]class
}

// Estimator keeps a gate's classes: a fixed number, two per set of the
// key's hash, the least recently measured of the two out.
type Estimator struct {
	seed  maphash.Seed
	sets  [ClassSets]classSet
	gens  atomic.Uint64
	top   atomic.Int64 // at least every fresh estimate: an operation with longer left is never late
	topAt atomic.Int64 // when top was last worked out anew (UnixNano)
}

func New() *Estimator { return &Estimator{seed: maphash.MakeSeed()} }

// Top is at least every fresh estimate: an operation with longer left is
// never late.
func (e *Estimator) Top() time.Duration { return time.Duration(e.top.Load()) }

// Found reports whether r is a class a lookup found or made.
func (r Ref) Found() bool { return r.c != nil }

// Ref is a class as a lookup found it: its slot and generation. A
// zero Ref, or one whose slot took another class since, estimates
// nothing and records nothing.
type Ref struct {
	set *classSet
	c   *class
	gen uint64
}

// Ref finds k's class; with create, one not kept replaces the least
// recently measured of its set.
func (e *Estimator) Ref(k Key, create bool) Ref {
	h := maphash.String(e.seed, k.Text)
	if k.Workload != "" {
		h ^= maphash.String(e.seed, k.Workload) * 31
	}
	h += uint64(k.Kind) + uint64(k.Within)<<8
	set := &e.sets[h%ClassSets]
	set.mu.Lock()
	defer set.mu.Unlock()
	for i := range set.ways {
		if c := &set.ways[i]; c.gen != 0 && c.key == k {
			return Ref{set, c, c.gen}
		}
	}
	if !create {
		return Ref{}
	}
	c := &set.ways[0]
	if o := &set.ways[1]; o.gen == 0 || c.gen != 0 && o.last.Before(c.last) {
		c = o
	}
	*c = class{key: k, gen: e.gens.Add(1)}
	return Ref{set, c, c.gen}
}

// Estimate returns the class's hold estimate at now, if it has a fresh one.
func (r Ref) Estimate(now time.Time) (time.Duration, bool) {
	if r.c == nil {
		return 0, false
	}
	r.set.mu.Lock()
	defer r.set.mu.Unlock()
	c := r.c
	if c.gen != r.gen || !c.freshLocked(now) {
		return 0, false
	}
	return c.est, true
}

// Judge reports whether an operation of the class due at dl, expected to
// wait ahead before it holds its permits from now, is refused as late, and
// the estimate it was judged by. An operation let through ends the class's
// refusals; while they go on, one goes every ProbeGap whatever its deadline, a
// probe, measured.
func (r Ref) Judge(now, dl time.Time, ahead time.Duration) (refuse bool, est time.Duration) {
	if r.c == nil {
		return false, 0
	}
	r.set.mu.Lock()
	defer r.set.mu.Unlock()
	c := r.c
	if c.gen != r.gen || !c.freshLocked(now) {
		return false, 0
	}
	switch {
	case !now.Add(ahead + c.est).After(dl):
		c.refusing = time.Time{}
		return false, c.est
	case c.refusing.IsZero():
		c.refusing, c.probeAt = now, now.Add(ProbeGap)
		return true, c.est
	case now.Before(c.probeAt):
		return true, c.est
	}
	c.probeAt = later(now, dl).Add(ProbeGap) // the next one, once this one is done or cut off
	return false, c.est
}

// freshLocked reports whether c's estimate may refuse work at now.
func (c *class) freshLocked(now time.Time) bool {
	return c.est > 0 && (!c.refusing.IsZero() || now.Sub(c.last) <= max(StaleAfter, StaleHolds*c.est))
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Observe records a hold of r's class measured at now, of an operation
// started at start; cut says it was cut off at its deadline: it needed at
// least held. A probe's hold, complete and under the estimate, restarts it
// (holds of operations started before are then ignored), else the next
// probe waits twice as long. It returns the class's base hold (0: none).
func (e *Estimator) Observe(r Ref, held time.Duration, cut, probe bool, start, now time.Time) (base time.Duration) {
	if r.c == nil {
		return 0
	}
	r.set.mu.Lock()
	c := r.c
	if c.gen != r.gen || start.Before(c.since) {
		r.set.mu.Unlock()
		return 0
	}
	if probe && !c.refusing.IsZero() {
		if !cut && held < c.est {
			c.n, c.next, c.cut, c.since, c.refusing = 0, 0, 0, start, time.Time{}
		} else {
			c.probeAt = now.Add(ProbeGap)
		}
	}
	if cut {
		c.cut = max(c.cut, held)
		if !start.Before(c.cutAt) { // not of the stall that cut off the one before
			c.cuts, c.cutAt = c.cuts+1, now
		}
	} else {
		c.cut, c.cuts = 0, 0
		c.holds[c.next] = held
		c.next = (c.next + 1) % HoldSamples
		c.n = min(c.n+1, HoldSamples)
	}
	c.est, c.last = c.cut, now
	if c.n > 0 {
		c.est = LowerMedian(c.holds[:c.n])
		if c.cuts >= 2 {
			c.est = max(c.est, c.cut)
		}
	}
	switch {
	case c.n < HoldSamples/2:
		c.base = c.est
	case c.cut == 0:
		c.base = min(c.base, c.est)
	}
	est, base := c.est, c.base
	r.set.mu.Unlock()
	if top := e.top.Load(); int64(est) > top {
		e.top.CompareAndSwap(top, int64(est))
	}
	if at := e.topAt.Load(); now.UnixNano()-at > int64(StaleAfter) && e.topAt.CompareAndSwap(at, now.UnixNano()) {
		e.top.Store(int64(e.highest(now)))
	}
	return base
}

// highest returns the highest fresh estimate at now.
func (e *Estimator) highest(now time.Time) time.Duration {
	var top time.Duration
	for i := range e.sets {
		set := &e.sets[i]
		set.mu.Lock()
		for j := range set.ways {
			if c := &set.ways[j]; c.gen != 0 && c.est > top && (!c.refusing.IsZero() || now.Sub(c.last) <= max(StaleAfter, StaleHolds*c.est)) {
				top = c.est
			}
		}
		set.mu.Unlock()
	}
	return top
}

// LowerMedian returns the lower median of ds, which it leaves unchanged.
func LowerMedian(ds []time.Duration) time.Duration {
	var s [HoldSamples]time.Duration
	n := copy(s[:], ds)
	for i := 1; i < n; i++ { // insertion sort: n ≤ HoldSamples
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s[(n-1)/2]
}

// HoldRing is a budget's last holds, all classes together: their lower
// median is the wait one operation ahead adds, per execution permit.
type HoldRing struct {
	holds   [HoldSamples]time.Duration
	n, next int
	median  time.Duration
}

// Median is the lower median of the holds added, 0 before any.
func (h *HoldRing) Median() time.Duration { return h.median }

// Len is how many holds it keeps, at most HoldSamples.
func (h *HoldRing) Len() int { return h.n }

func (h *HoldRing) Add(held time.Duration) {
	h.holds[h.next] = held
	h.next = (h.next + 1) % HoldSamples
	h.n = min(h.n+1, HoldSamples)
	h.median = LowerMedian(h.holds[:h.n])
}
