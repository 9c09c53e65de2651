//go:build go1.25

package bulkhead

// Policy.Adaptive: (*adaptive).observe driven with synthetic hold times,
// one window of completions at a time, and the limit in force through a
// budget and a gate.

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"strings"
	"testing"
	"time"
)

// adWork is the hold time of an operation with no queueing inside the
// database.
const adWork = 10 * time.Millisecond

// adClock is the time adWindow's completions happen at.
var adClock = time.Unix(0, 0)

// adWindow feeds one window of completions run under limit b, each
// held hold(b), with callers waiting (waited) on each, and returns the
// limit in force after it. The b running complete one every hold/b
// (adClock). It fails unless the window is max(8, 4·b) completions long,
// only its last one may change the limit, and the limit moves by at most
// one, to the floor (a probe) or back from it.
func adWindow(t *testing.T, a *adaptive, b int, hold time.Duration, waited bool) int {
	t.Helper()
	n := max(8, 4*b)
	for i := 1; i < n; i++ {
		adClock = adClock.Add(hold / time.Duration(b))
		if nb, ok := a.observe(hold, b, waited, adClock); ok || nb != b {
			t.Fatalf("completion %d of a window of %d under b=%d returned %d, %v; want b unchanged until the window ends", i, n, b, nb, ok)
		}
	}
	probing := a.resume
	adClock = adClock.Add(hold / time.Duration(b))
	nb, ok := a.observe(hold, b, waited, adClock)
	if ok != (nb != b) || (nb < b-1 || nb > b+1) && nb != a.floor && probing == 0 {
		t.Fatalf("window end under b=%d returned %d, %v; want b moved by at most one or to the floor, and true only if it moved", b, nb, ok)
	}
	return nb
}

// adCores is a database that runs cores operations at once and queues the
// rest: with b running, each holds work·max(b, cores)/cores.
func adCores(cores int, work time.Duration) func(b int) time.Duration {
	return func(b int) time.Duration {
		return work * time.Duration(max(b, cores)) / time.Duration(cores)
	}
}

// adRun runs windows under model from b and returns the limit after each.
func adRun(t *testing.T, a *adaptive, b, windows int, model func(int) time.Duration, waited bool) []int {
	t.Helper()
	trace := make([]int, windows)
	for i := range trace {
		b = adWindow(t, a, b, model(b), waited)
		if b < a.floor || b > a.ceil {
			t.Fatalf("window %d: b=%d, want within floor %d and ceiling %d (trace %v)", i, b, a.floor, a.ceil, trace[:i])
		}
		trace[i] = b
	}
	return trace
}

// With the hold the same at every limit (no queueing inside the
// database) and callers waiting, b climbs by one per window to the
// ceiling, and stays there.
func TestAdaptiveClimbsOnePerWindowToTheCeilingWhileHoldsStayFlat(t *testing.T) {
	a := &adaptive{floor: 1, ceil: 6}
	trace := adRun(t, a, 1, 12, func(int) time.Duration { return adWork }, true)
	want := []int{2, 3, 4, 5, 6, 6, 6, 6, 6, 6, 6, 6}
	for i := range want {
		if trace[i] != want[i] {
			t.Fatalf("b after each window %v, want %v", trace, want)
		}
	}
}

// Without callers waiting, b never grows, however flat the holds.
func TestAdaptiveNeverGrowsWithoutCallersWaiting(t *testing.T) {
	a := &adaptive{floor: 1, ceil: 8}
	for i, b := range adRun(t, a, 1, 50, func(int) time.Duration { return adWork }, false) {
		if b != 1 {
			t.Fatalf("window %d: b=%d without anyone waiting, want 1", i, b)
		}
	}
}

// One completion with callers waiting is enough for its window to grow;
// the next window, with nobody waiting, does not.
func TestAdaptiveGrowsOnlyInAWindowInWhichCallersWaited(t *testing.T) {
	a := &adaptive{floor: 1, ceil: 8}
	a.observe(adWork, 1, true, adClock)
	for range 6 {
		a.observe(adWork, 1, false, adClock)
	}
	nb, ok := a.observe(adWork, 1, false, adClock)
	if !ok || nb != 2 {
		t.Fatalf("window with one completion seeing a waiter ended with %d, %v; want 2, true", nb, ok)
	}
	if nb := adWindow(t, a, 2, adWork, false); nb != 2 {
		t.Fatalf("next window, nobody waiting: b=%d, want 2", nb)
	}
}

// On a database that runs 2 operations at once, the limit settles there:
// a growth to 3 holds each operation 1.5 times longer for no throughput,
// so it is undone after one window and tried again after 4·probeEvery
// windows, then twice as many after each undo, up to 32·probeEvery. Flat
// holds at 2 confirm the lowest hold: no window runs at the floor.
func TestAdaptiveSettlesAtTheDatabasesConcurrencyAndBacksOffItsTries(t *testing.T) {
	a := &adaptive{floor: 1, ceil: 16}
	trace := adRun(t, a, 1, 100*probeEvery, adCores(2, adWork), true)
	var tries []int
	for i, b := range trace {
		switch {
		case b == 3 && (i+1 == len(trace) || trace[i+1] == 2):
			tries = append(tries, i)
		case b != 2:
			t.Fatalf("window %d: b=%d, want 2 but for single windows at 3 (trace %v)", i, b, trace[:i+1])
		}
	}
	gap := 4 * probeEvery
	for k := 1; k < len(tries); k++ {
		if got := tries[k] - tries[k-1]; got != gap+1 {
			t.Fatalf("tries of 3 at windows %v: gap %d after try %d, want %d (each undo blocks twice as long, up to %d)", tries, got, k, gap+1, 32*probeEvery)
		}
		gap = min(2*gap, 32*probeEvery)
	}
	if len(tries) < 5 {
		t.Fatalf("tries of 3 at windows %v, want 5 or more in %d windows", tries, len(trace))
	}
}

// The convergence above, window by window: b reaches 2 in one window, tries
// 3 in the next and is back at 2 after it, for 4·probeEvery windows.
func TestAdaptiveReachesTheDatabasesConcurrencyInOneWindow(t *testing.T) {
	a := &adaptive{floor: 1, ceil: 16}
	trace := adRun(t, a, 1, 4*probeEvery, adCores(2, adWork), true)
	for i, b := range trace {
		want := 2
		if i == 1 {
			want = 3
		}
		if b != want {
			t.Fatalf("window %d: b=%d, want %d (trace %v)", i, b, want, trace)
		}
	}
}

// Where the client shares the database's cores, two running hold 1.45
// times longer than one, and read 0.62 operations queued: the growth from
// the floor still won 0.38 of an operation's throughput, and is kept. No
// window confirms the lowest hold, so one in probeEvery runs at the floor;
// b is 2 in all the others.
func TestAdaptiveKeepsAGrowthThatWonThroughputThoughHoldsRose(t *testing.T) {
	a := &adaptive{floor: 1, ceil: 8}
	model := func(b int) time.Duration {
		return []time.Duration{adWork, 145 * adWork / 100, 22 * adWork / 10}[min(b, 3)-1]
	}
	if b := adWindow(t, a, 1, model(1), false); b != 1 {
		t.Fatalf("b after a window nobody waited in: %d, want 1", b)
	}
	trace := adRun(t, a, 1, 4*probeEvery, model, true)
	for i, b := range trace {
		if b != 2 && (b != 1 || i == 0 || trace[i-1] != 2 || i+1 < len(trace) && trace[i+1] != 2) {
			t.Fatalf("window %d: b=%d, want 2 but for single probe windows at the floor (trace %v)", i, b, trace[:i+1])
		}
	}
	if probes := strings.Count(fmt.Sprint(trace), "1"); probes < 2 || probes > 4 {
		t.Fatalf("%d probes at the floor in %d windows, want one in %d (trace %v)", probes, len(trace), probeEvery, trace)
	}
}

// When the work gets 30% longer at every limit, the lowest hold is stale:
// at b=4 the holds read 0.92 operations queued, too few to shrink, too
// many to grow, and no window confirms the lowest. Within probeEvery
// windows one runs at the floor, measures the longer work, and b returns
// to 4, where flat holds confirm it again.
func TestAdaptiveProbesTheFloorOnlyWhenNoWindowConfirmsTheLowestHold(t *testing.T) {
	a := &adaptive{floor: 1, ceil: 4}
	flat := func(w time.Duration) func(int) time.Duration { return func(int) time.Duration { return w } }
	before := adRun(t, a, 1, 3*probeEvery, flat(adWork), true)
	for i, b := range before[3:] {
		if b != 4 {
			t.Fatalf("window %d of flat holds: b=%d, want 4 and no probe while the holds confirm the lowest (trace %v)", i+3, b, before)
		}
	}
	after := adRun(t, a, 4, 2*probeEvery, flat(13*adWork/10), true)
	probe := slices.Index(after, 1)
	if probe < 0 || probe > probeEvery {
		t.Fatalf("after the work got 30%% longer: windows %v, want one at the floor within %d", after, probeEvery)
	}
	for i, b := range after {
		if i != probe && b != 4 {
			t.Fatalf("window %d after the work got longer: b=%d, want 4 but for the probe at window %d (trace %v)", i, b, probe, after)
		}
	}
}

// When the work itself gets longer (holds triple at the same b), the
// limit shrinks one per window to the floor, measures the longer work's
// hold there, and climbs back to the level it had, one per window (on a
// database of 4, at most one window above it).
func TestAdaptiveRecoversItsLevelAfterTheWorkGetsLonger(t *testing.T) {
	for _, c := range []struct {
		name  string
		model func(work time.Duration) func(int) time.Duration
		level int // reached before the shift
	}{
		{"flat holds", func(w time.Duration) func(int) time.Duration {
			return func(int) time.Duration { return w }
		}, 8},
		{"a database of 4", func(w time.Duration) func(int) time.Duration { return adCores(4, w) }, 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := &adaptive{floor: 1, ceil: 8}
			before := adRun(t, a, 1, 8, c.model(adWork), true)
			if b := before[len(before)-1]; b != c.level {
				t.Fatalf("b before the shift %d, want %d (trace %v)", b, c.level, before)
			}
			bound := 2*(c.level-a.floor) + 2
			after := adRun(t, a, c.level, bound, c.model(3*adWork), true)
			if after[0] >= c.level {
				t.Fatalf("first window after the holds tripled: b=%d, want below %d", after[0], c.level)
			}
			back := -1
			for i, b := range after {
				// Above the level, one window trying one more, undone after it.
				if b > c.level && (b > c.level+1 || i+1 < len(after) && after[i+1] != c.level) {
					t.Fatalf("window %d after the shift: b=%d, above the level %d but for a single try of one more (trace %v)", i, b, c.level, after)
				}
				if b == c.level && back < 0 {
					back = i + 1
				}
			}
			if back < 0 {
				t.Fatalf("b never back at %d within %d windows of the shift (trace %v)", c.level, bound, after)
			}
			t.Logf("back at %d after %d windows (bound %d): %v", c.level, back, bound, after[:back])
		})
	}
}

// On a database of 2 that has undone a try of 3, the work tripling takes
// b to the floor and back to 2, not to 3: the try stays blocked across the
// visit to the floor (a try of 3 there runs holds half again as long,
// which the deadlines of callers behind them do not leave room for).
func TestAdaptiveDoesNotRetryAnUndoneGrowthAfterTheWorkGetsLonger(t *testing.T) {
	a := &adaptive{floor: 1, ceil: 16}
	before := adRun(t, a, 1, 8, adCores(2, adWork), true)
	if !slices.Contains(before, 3) || before[len(before)-1] != 2 {
		t.Fatalf("before the shift: windows %v, want a try of 3 undone, ending at 2", before)
	}
	after := adRun(t, a, 2, 4*probeEvery-16, adCores(2, 3*adWork), true)
	if !slices.Contains(after, 1) {
		t.Fatalf("after the work tripled: windows %v, want a visit to the floor", after)
	}
	for i, b := range after {
		if b > 2 {
			t.Fatalf("window %d after the work tripled: b=%d, want at most 2 while the try of 3 is blocked (trace %v)", i, b, after[:i+1])
		}
	}
	if last := after[len(after)-1]; last != 2 {
		t.Fatalf("b %d at the end, want 2 (trace %v)", last, after)
	}
}

// However long the holds get, b never goes below the floor: on a database
// saturated after a window of short holds, it comes down one per window
// to the floor, and never goes lower.
func TestAdaptiveNeverGoesBelowTheFloor(t *testing.T) {
	a := &adaptive{floor: 2, ceil: 8}
	if b := adWindow(t, a, 8, adWork, true); b != 8 {
		t.Fatalf("b after a window of short holds at the ceiling: %d, want 8", b)
	}
	trace := adRun(t, a, 8, 100, func(b int) time.Duration { return 4 * time.Duration(b) * adWork }, true)
	for i := range 6 {
		if trace[i] != 7-i {
			t.Fatalf("b after each window %v, want 7, 6, ... down to the floor 2", trace[:6])
		}
	}
	for i, b := range trace { // adRun checks each window against the floor too
		if b < a.floor {
			t.Fatalf("window %d: b=%d, below the floor %d", i, b, a.floor)
		}
	}
}

// A hold above four times the budget's average (a statement cut off at
// its deadline, which pgx's cancel request keeps 100 ms longer) is left out
// of adapt's window: flat holds with such outliers climb as flat holds do
// (counted, they would read as queueing and shrink b).
func TestAdaptiveLeavesOutHoldsFarAboveTheAverage(t *testing.T) {
	l := newBudget("")
	l.resize(8, 8, time.Hour, false, 1)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.waiting = 1 // a caller waits all along (none is queued: grantLocked serves nobody)
	defer func() { l.waiting = 0 }()
	for w, want := range []int{2, 3, 4} {
		if w > 0 { // one outlier a window, once the floor's window measured the unqueued hold
			l.observeLocked(10 * adWork)
		}
		for range max(8, 4*l.b) {
			l.observeLocked(adWork)
		}
		if l.b != want {
			t.Fatalf("after window %d of flat holds and an outlier: b=%d, want %d", w, l.b, want)
		}
	}
}

// Whatever the holds and waits, b stays within floor and ceiling and
// moves by at most one, only at the end of a window (adWindow, adRun).
func TestAdaptiveStaysWithinItsBoundsUnderArbitraryHolds(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	a := &adaptive{floor: 2, ceil: 7}
	b := 2
	for w := range 2000 {
		hold := time.Duration(1+rng.Intn(1000)) * time.Microsecond
		b = adWindow(t, a, b, hold, rng.Intn(2) == 0)
		if b < 2 || b > 7 {
			t.Fatalf("window %d: b=%d, want 2 to 7", w, b)
		}
	}
}

// Through a budget: the limit starts at the floor, and growing it serves
// the waiter queued behind the one running.
func TestAdaptiveBudgetStartsAtTheFloorAndGrowingServesAWaiter(t *testing.T) {
	l := newBudget("")
	l.resize(8, 8, time.Hour, false, 1)
	admMustAcquire(t, l)
	res := admGo(context.Background(), l)
	admWaitFor(t, func() bool { return admRead(l).waiting == 1 })
	if s := admStats(l); s.MaxConcurrent != 1 {
		t.Fatalf("MaxConcurrent %d at the start, want the floor 1", s.MaxConcurrent)
	}
	l.mu.Lock()
	for range 8 { // a window of flat holds while a caller waits
		l.observeLocked(adWork)
	}
	l.mu.Unlock()
	if r := dlRecv(t, "the waiter", res); r.err != nil {
		t.Fatalf("waiter when b grew: %v, want the new permit", r.err)
	}
	if s := admStats(l); s.MaxConcurrent != 2 || s.Running != 2 || s.Waiting != 0 || s.Hold != adWork {
		t.Fatalf("stats %+v, want B=2 in force, 2 running, Hold %v", s, adWork)
	}
	l.release(0)
	l.release(0)
}

// Through a gate: Stats.MaxConcurrent is the B in force, which starts at
// MinConcurrent (1 for 0) under Adaptive and is the policy's without it;
// workloads keep their own B.
func TestAdaptiveGateStartsAtTheFloorAndSetPolicyMovesIt(t *testing.T) {
	g, _, _ := dlGate(t, Policy{MaxConcurrent: 8, Adaptive: true,
		Workloads: map[string]Workload{"batch": {MaxConcurrent: 4}}})
	want := func(what string, b int) {
		t.Helper()
		if s := g.Stats(); s.MaxConcurrent != b {
			t.Fatalf("%s: MaxConcurrent %d, want %d", what, s.MaxConcurrent, b)
		}
	}
	want("Adaptive, MinConcurrent 0", 1)
	if ws, ok := g.WorkloadStats("batch"); !ok || ws.MaxConcurrent != 4 {
		t.Fatalf("workload under Adaptive: %+v, %v; want its own B of 4", ws, ok)
	}
	set := func(p Policy) {
		t.Helper()
		if err := g.SetPolicy(p); err != nil {
			t.Fatal(err)
		}
	}
	set(Policy{MaxConcurrent: 8})
	want("Adaptive off", 8)
	set(Policy{MaxConcurrent: 8, Adaptive: true, MinConcurrent: 3})
	want("Adaptive on again, MinConcurrent 3", 3)
	set(Policy{MaxConcurrent: 2, Adaptive: true})
	want("ceiling lowered below the B in force", 2)
	if err := g.Cap(context.Background(), 1, -1); err != nil {
		t.Fatal(err)
	}
	want("capped at 1", 1)

	g2, _, _ := dlGate(t, Policy{MaxConcurrent: 8, Adaptive: true, MinConcurrent: 3})
	if s := g2.Stats(); s.MaxConcurrent != 3 {
		t.Fatalf("new gate with MinConcurrent 3: MaxConcurrent %d, want 3", s.MaxConcurrent)
	}
}

// With no queue (MaxQueue 0) nobody ever waits: callers refused at
// admission are the demand that lets the limit grow.
func TestAdaptiveGrowsOnRefusalsWhenNobodyCanWait(t *testing.T) {
	l := newBudget("")
	l.resize(8, 0, 0, false, 1)
	admMustAcquire(t, l)
	if err := l.take(context.Background(), &passage{}); !errors.Is(err, ErrAdmissionFull) {
		t.Fatalf("admit with the one permit taken: %v, want ErrAdmissionFull", err)
	}
	l.mu.Lock()
	for range 8 {
		l.observeLocked(adWork)
	}
	b := l.b
	l.mu.Unlock()
	if b != 2 {
		t.Fatalf("b after a window of flat holds with a caller refused: %d, want 2", b)
	}
	l.release(0)
}

// A growth is judged on the window after it only if callers waited, or
// were refused, at every completion of it. From the floor, a window at 2
// whose holds rose and whose throughput stayed that of 1 is undone when
// callers waited or were refused throughout; when the queue ran dry once,
// its throughput is the callers' arrivals, and the growth is kept.
func TestAdaptiveJudgesAGrowthOnlyOnAWindowThatNeverRanDry(t *testing.T) {
	for _, demand := range []string{"waited", "refused", "ran dry"} {
		a := &adaptive{floor: 1, ceil: 16}
		if b := adWindow(t, a, 1, adWork, false); b != 1 { // starts the clock of the windows
			t.Fatalf("b after a window nobody waited in: %d, want 1", b)
		}
		if b := adWindow(t, a, 1, adWork, true); b != 2 {
			t.Fatalf("b after a window at the floor with callers waiting: %d, want 2", b)
		}
		// 8 completions one work apart (the throughput of 1), each held 1.5 works.
		var b int
		for i := range 8 {
			if demand == "refused" {
				a.want()
			}
			adClock = adClock.Add(adWork)
			b, _ = a.observe(3*adWork/2, 2, demand == "waited" || demand == "ran dry" && i != 3, adClock)
		}
		kept, want := demand == "ran dry", 1
		if kept {
			want = 2
		}
		if b != want {
			t.Fatalf("callers %s in the window after the growth: b=%d, want %d", demand, b, want)
		}
		if blocked := a.top != 0; blocked == kept {
			t.Fatalf("callers %s in the window after the growth: growth to 2 blocked %v, want %v", demand, blocked, !kept)
		}
	}
}
