//go:build go1.25

package estimate

// The estimates of one class: a median no outlier lifts, cuts counted as
// lower bounds, fresh evidence only, probes, and a bounded set of classes.

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

// A class's estimate is the median of its last holds: one outlier, or
// three, leave it; five of eight move it.
func TestAClassEstimateIsTheMedianOfItsLastHoldsThatNoOutlierLifts(t *testing.T) {
	e := New()
	r := e.Ref(Key{Kind: 1, Text: "work"}, true)
	now := time.Now()
	type holds struct {
		d time.Duration
		n int
	}
	for _, step := range []struct {
		add  []holds
		want time.Duration
		when string
	}{
		{[]holds{{time.Millisecond, 1}}, time.Millisecond, "after one hold of 1ms"},
		{[]holds{{time.Second, 1}}, time.Millisecond, "after 1ms then 1s (one outlier lifts nothing)"},
		{[]holds{{time.Millisecond, 6}, {time.Second, 3}}, time.Millisecond, "with 3 of its last 8 holds at 1s"},
		{[]holds{{time.Second, 2}}, time.Second, "with 5 of its last 8 holds at 1s"},
	} {
		for _, h := range step.add {
			for range h.n {
				e.Observe(r, h.d, false, false, now, now)
			}
		}
		if d, _ := r.Estimate(now); d != step.want {
			t.Fatalf("estimate %v %s, want %v", d, step.when, step.want)
		}
	}
}

// Holds cut off at their deadline lift the estimate only after two in a
// row, the second begun after the first was cut off: one stall that cuts
// off every operation running is one outlier.
func TestOneStallThatCutsOffAllThatRunsDoesNotLiftTheEstimate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, r := estimated(time.Millisecond)
		start := time.Now()
		time.Sleep(20 * time.Millisecond) // a stall: four running, each cut off at its 20ms deadline
		for range 4 {
			e.Observe(r, 20*time.Millisecond, true, false, start, time.Now())
		}
		if d, _ := r.Estimate(time.Now()); d != time.Millisecond {
			t.Fatalf("estimate %v after one stall cut off four operations, want 1ms still", d)
		}
		start = time.Now()
		time.Sleep(20 * time.Millisecond) // cut off again, begun after the stall
		e.Observe(r, 20*time.Millisecond, true, false, start, time.Now())
		if d, _ := r.Estimate(time.Now()); d != 20*time.Millisecond {
			t.Fatalf("estimate %v after a second cut-off begun after the first, want 20ms", d)
		}
	})
}

// No refusal without fresh evidence: an estimate whose last hold is older
// than max(1s, 4 × the estimate) refuses nothing.
func TestAnEstimateWithNoRecentHoldRefusesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, c := range []struct{ hold, stale time.Duration }{
			{10 * time.Millisecond, StaleAfter},
			{time.Second, 4 * time.Second},
		} {
			_, r := estimated(c.hold)
			time.Sleep(c.stale)
			if _, ok := r.Estimate(time.Now()); !ok {
				t.Fatalf("hold %v: no estimate %v after its last hold, want one", c.hold, c.stale)
			}
			time.Sleep(time.Nanosecond)
			if d, ok := r.Estimate(time.Now()); ok {
				t.Fatalf("hold %v: estimate %v past %v after its last hold, want none", c.hold, d, c.stale)
			}
		}
	})
}

// While a class refuses the callers with little time left, the holds of
// its operations that had enough time are no probes: however slow, they
// do not put the next probe off.
func TestHoldsOfOperationsNotRefusedDoNotPutAProbeOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, r := estimated(200 * time.Millisecond)
		left := 100 * time.Millisecond
		if late, _ := r.Judge(time.Now(), time.Now().Add(left), 0); !late {
			t.Fatal("100ms left for work of 200ms: let go, want it refused")
		}
		time.Sleep(10 * time.Millisecond)
		start := time.Now() // a caller given a second, let go
		time.Sleep(200 * time.Millisecond)
		e.Observe(r, 200*time.Millisecond, false, false, start, time.Now())
		time.Sleep(ProbeGap - 210*time.Millisecond)
		if late, _ := r.Judge(time.Now(), time.Now().Add(left), 0); late {
			t.Fatalf("ProbeGap after the first refusal: refused, want a probe")
		}
	})
}

// While its work is refused, a class lets one operation go ProbeGap after
// the first refusal, then ProbeGap after the last probe ended, however slow
// the probes found the work; a probe that held under the estimate restarts
// it, and holds of operations started before that tell nothing. A hold cut
// off at its deadline only raises the estimate.
func TestARefusedClassLetsAProbeGoAndAFastOneRestartsItsEstimate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, r := estimated(2 * time.Second)
		old := time.Now() // of the holds: the fake clock has not moved
		due := func() time.Time { return time.Now().Add(time.Second) }
		refused := func() bool {
			late, _ := r.Judge(time.Now(), due(), 0)
			return late
		}
		if !refused() {
			t.Fatal("the first refusal: let go, want it refused")
		}
		for i := range 4 { // probes that find the work as slow
			time.Sleep(ProbeGap - time.Millisecond)
			if !refused() {
				t.Fatalf("before probe %d: let go, want it refused", i)
			}
			time.Sleep(time.Millisecond)
			probe := time.Now()
			if refused() {
				t.Fatalf("ProbeGap after the last probe ended, probe %d: refused, want it let go", i)
			}
			time.Sleep(time.Second) // cut off at its deadline: only a lower bound, as slow
			e.Observe(r, time.Second, true, true, probe, time.Now())
			if d, _ := r.Estimate(time.Now()); d != 2*time.Second {
				t.Fatalf("estimate %v after a probe cut off at 1s, want 2s still", d)
			}
		}
		time.Sleep(ProbeGap)
		probe := time.Now()
		if refused() {
			t.Fatal("at ProbeGap: refused, want a probe")
		}
		time.Sleep(5 * time.Millisecond)
		e.Observe(r, 5*time.Millisecond, false, true, probe, time.Now()) // the probe: fast
		if d, _ := r.Estimate(time.Now()); d != 5*time.Millisecond {
			t.Fatalf("estimate %v after a fast probe, want it restarted at 5ms", d)
		}
		e.Observe(r, 2*time.Second, false, false, old, time.Now()) // started before: tells nothing
		if d, _ := r.Estimate(time.Now()); d != 5*time.Millisecond {
			t.Fatalf("estimate %v after an old hold, want 5ms still", d)
		}
		if refused() {
			t.Fatal("a deadline a second away for work of 5ms: refused")
		}
	})
}

// The classes are bounded: a gate keeps ClassSets×2 of them, the least
// recently measured of a set out; a reference to an evicted class records
// nothing into its successor.
func TestClassesAreBoundedAndAnEvictedOneRecordsNothing(t *testing.T) {
	e := New()
	now := time.Now()
	first := e.Ref(Key{Kind: 1, Text: "first"}, true)
	e.Observe(first, time.Millisecond, false, false, now, now)
	refs := map[*class]Ref{}
	for i := range 20 * ClassSets {
		r := e.Ref(Key{Kind: 1, Text: fmt.Sprint("text ", i)}, true)
		e.Observe(r, time.Millisecond, false, false, now, now.Add(time.Duration(i+1)))
		refs[r.c] = r
	}
	if len(refs) > 2*ClassSets {
		t.Fatalf("%d class slots used, want at most %d", len(refs), 2*ClassSets)
	}
	if r := e.Ref(Key{Kind: 1, Text: "first"}, false); r.c != nil {
		t.Fatal("the first class, least recently measured, is still kept")
	}
	e.Observe(first, time.Hour, false, false, now, now) // its slot has another class now
	for _, r := range refs {
		if d, _ := r.Estimate(now.Add(time.Hour)); d == time.Hour {
			t.Fatal("an evicted class's reference recorded into its successor")
		}
	}
}

// estimated returns a new estimator and its class "work", whose last
// holds were all d, measured now.
func estimated(d time.Duration) (*Estimator, Ref) {
	e := New()
	r := e.Ref(Key{Kind: 1, Text: "work"}, true)
	now := time.Now()
	for range HoldSamples {
		e.Observe(r, d, false, false, now, now)
	}
	return e, r
}
