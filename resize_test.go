//go:build go1.25

package bulkhead_test

// Gate.SetPolicy, Cap and CapUntil with operations in flight: no permit
// lost or invented.

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

func rzSet(t *testing.T, g *bulkhead.Gate, p bulkhead.Policy) {
	t.Helper()
	if err := g.SetPolicy(p); err != nil {
		t.Fatalf("SetPolicy(%+v): %v", p, err)
	}
}

// rzFull fails unless exactly b operations hold permits at once and one
// more is refused (queue wait 0) with a rejection matching cause.
func rzFull(t *testing.T, r *wlRig, b int, tag string, cause error) {
	t.Helper()
	bg := context.Background()
	done := r.startN(t, bg, tag+"-full", b)
	if s := r.g.Stats(); s.Running != b || s.Waiting != 0 {
		t.Fatalf("%d running at once: stats %+v", b, s)
	}
	_, err := r.db.ExecContext(bulkhead.WithQueueWait(bg, 0), "quick")
	if !errors.Is(err, bulkhead.ErrRejected) || !errors.Is(err, cause) {
		t.Fatalf("%s: operation %d with B=%d: %v, want a rejection matching %v", tag, b+1, b, err, cause)
	}
	r.done(t, done...)
	if s := r.g.Stats(); s.Running != 0 || s.Waiting != 0 {
		t.Fatalf("after the full round: stats %+v", s)
	}
}

// rzSettled fails unless no permit is held (wlRig.balanced) and exactly b
// execution permits are left (rzFull).
func rzSettled(t *testing.T, r *wlRig, b int) {
	t.Helper()
	r.balanced(t)
	rzFull(t, r, b, "after", bulkhead.ErrRejected)
}

func TestShrinkingLetsRunningWorkFinishAndAdmitsNewWorkOnlyBelowTheNewB(t *testing.T) {
	r := wlOpen(t, bulkhead.Policy{MaxConcurrent: 4})
	bg := context.Background()
	held := r.startN(t, bg, "h", 4)
	rzSet(t, r.g, bulkhead.Policy{MaxConcurrent: 2})
	if s := r.g.Stats(); s.MaxConcurrent != 2 || s.MaxQueue != 0 || s.Running != 4 {
		t.Fatalf("after shrinking to B=2 under 4 running: %+v, want the new limits and the 4 still running", s)
	}
	// The running work goes on; new work is refused until fewer than the
	// new B run.
	var n1 wlOp
	for i, running := range []int{3, 2, 1} {
		r.done(t, held[i])
		if running >= 2 {
			r.refusedFull(t, fmt.Sprintf("new op with %d running and B=2", running))
			continue
		}
		n1 = r.start(t, bg, "n1")
	}
	r.refusedFull(t, "new op with h3 and n1 running, B=2")
	r.done(t, held[3], n1)
	rzSettled(t, r, 2)
}

func TestShrinkingWithAQueueMakesNewWorkWaitUntilRunningWorkIsBelowTheNewB(t *testing.T) {
	r := wlOpen(t, bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 4, QueueWait: bulkhead.MaxQueueWait})
	bg := context.Background()
	held := r.startN(t, bg, "h", 4)
	rzSet(t, r.g, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: bulkhead.MaxQueueWait})
	r.refusedFull(t, "new op with 4 admitted and B+Q=4")
	r.done(t, held[0])
	w1 := r.exec(bg, "w1") // 3 running, B=2: admitted, waits
	awaitState(t, "w1 waits", func() bool { return r.g.Stats().Waiting == 1 })
	r.done(t, held[1])
	if s := r.g.Stats(); s.Running != 2 || s.Waiting != 1 || r.hasEntered("w1") {
		t.Fatalf("2 running with B=2: %+v, w1 entered %v; want w1 still waiting", s, r.hasEntered("w1"))
	}
	r.done(t, held[2])
	r.await(t, "w1") // 1 running: w1 gets the permit
	r.done(t, held[3], w1)
	rzSettled(t, r, 2)
}

func TestGrowingWakesWaitersInFIFOOrder(t *testing.T) {
	r := wlOpen(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 3, QueueWait: bulkhead.MaxQueueWait})
	bg := context.Background()
	h0 := r.start(t, bg, "h0")
	var ws []wlOp
	for i := 1; i <= 3; i++ {
		ws = append(ws, r.exec(bg, fmt.Sprintf("w%d", i)))
		awaitState(t, fmt.Sprintf("w%d queued", i), func() bool { return r.g.Stats().Waiting == i })
	}
	rzSet(t, r.g, bulkhead.Policy{MaxConcurrent: 3, MaxQueue: 3, QueueWait: bulkhead.MaxQueueWait})
	r.await(t, "w1", "w2")
	if s := r.g.Stats(); s.Running != 3 || s.Waiting != 1 || r.hasEntered("w3") {
		t.Fatalf("after growing to B=3: %+v, entered %v; want w1 and w2 running, w3 waiting", s, r.enteredOrder())
	}
	rzSet(t, r.g, bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 3, QueueWait: bulkhead.MaxQueueWait})
	r.await(t, "w3")
	r.done(t, append(ws, h0)...)
	rzSettled(t, r, 4)
}

func TestResizingAWorkloadWithItsOperationsInFlight(t *testing.T) {
	base := bulkhead.Policy{MaxConcurrent: 4}
	withBatch := func(w bulkhead.Workload) bulkhead.Policy {
		p := base
		p.Workloads = map[string]bulkhead.Workload{"batch": w}
		return p
	}
	r := wlOpen(t, base)
	bg := context.Background()
	batch := bulkhead.WithWorkload(bg, "batch")
	refused := func(what string) {
		t.Helper()
		_, err := r.db.ExecContext(batch, "quick")
		wlRejected(t, what, err, bulkhead.ErrAdmissionFull, "batch", r.wstats(t, "batch").MaxConcurrent, 0)
	}

	u1 := r.start(t, bg, "u1")
	// Added while untagged work runs.
	rzSet(t, r.g, withBatch(bulkhead.Workload{MaxConcurrent: 1}))
	b1 := r.start(t, batch, "b1")
	refused("batch at B=1")
	// Grown: the next one runs.
	rzSet(t, r.g, withBatch(bulkhead.Workload{MaxConcurrent: 2}))
	b2 := r.start(t, batch, "b2")
	// Shrunk under two running: both go on, new batch work waits for
	// fewer than one to run.
	rzSet(t, r.g, withBatch(bulkhead.Workload{MaxConcurrent: 1}))
	if ws := r.wstats(t, "batch"); ws.Running != 2 || ws.MaxConcurrent != 1 {
		t.Fatalf("batch after shrinking under 2 running: %+v", ws)
	}
	refused("batch with 2 running, B=1")
	r.done(t, b1)
	refused("batch with 1 running, B=1")
	r.done(t, b2)
	b3 := r.start(t, batch, "b3")

	// Removed while b3 runs: b3 ends under the old budget; batch-tagged
	// work now passes the global budget alone.
	rzSet(t, r.g, base)
	if _, ok := r.g.WorkloadStats("batch"); ok {
		t.Fatal("WorkloadStats(batch) is ok after the workload was removed")
	}
	b4 := r.start(t, batch, "b4")
	r.done(t, b3)
	if s := r.g.Stats(); s.Running != 2 {
		t.Fatalf("global after b3 ended: %+v, want u1 and b4 running", s)
	}
	r.done(t, u1, b4)
	r.balanced(t)

	// Added again once its operations ended: exactly its B.
	rzSet(t, r.g, withBatch(bulkhead.Workload{MaxConcurrent: 2}))
	if ws := r.wstats(t, "batch"); ws.Running != 0 || ws.Waiting != 0 || ws.MaxConcurrent != 2 {
		t.Fatalf("re-added batch: %+v, want B=2 and nothing held", ws)
	}
	b5, b6 := r.exec(batch, "b5"), r.exec(batch, "b6")
	r.await(t, "b5", "b6")
	refused("re-added batch at B=2")
	r.done(t, b5, b6)
	rzSettled(t, r, 4)
}

// A removed workload's queued operation waits for its old budget's permit,
// not for anything else.
func TestAnOperationQueuedInAWorkloadThatIsRemovedRunsWhenItsOldBudgetFrees(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, _, b1, b2 := wlBatchQueued(t, 4, time.Hour)
		rzSet(t, r.g, bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 4, QueueWait: time.Hour})
		synctest.Wait()
		if r.hasEntered("b2") {
			t.Fatal("removing the workload let its queued operation run beside the one holding its permit")
		}
		r.done(t, b1)
		synctest.Wait()
		if !r.hasEntered("b2") {
			t.Fatal("the queued operation of the removed workload did not get the permit b1 gave back")
		}
		r.done(t, b2)
		r.balanced(t)
	})
}

func TestAnInvalidSetPolicyChangesNothing(t *testing.T) {
	p := bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 1, QueueWait: 5 * time.Millisecond,
		Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1, MaxQueue: 0, QueueWait: time.Millisecond}}}
	r := wlOpen(t, p)
	h1 := r.exec(bulkhead.WithWorkload(context.Background(), "batch"), "h1")
	r.await(t, "h1")
	before, beforeW := r.g.Stats(), r.wstats(t, "batch")
	for _, bad := range []bulkhead.Policy{
		{MaxConcurrent: 0},
		{MaxConcurrent: 3, MaxQueue: -1},
		{MaxConcurrent: 3, QueueWait: -time.Second},
		{MaxConcurrent: 3, QueueWait: 2 * bulkhead.MaxQueueWait},
		{MaxConcurrent: 3, Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 4}}},
		{MaxConcurrent: 3, Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1, MaxQueue: 3}}},
		{MaxConcurrent: 3, Workloads: map[string]bulkhead.Workload{"Batch": {MaxConcurrent: 1}}},
		{MaxConcurrent: 3, Workloads: map[string]bulkhead.Workload{"ok": {MaxConcurrent: 1}, "zz": {MaxConcurrent: 0}}},
		{MaxConcurrent: 3, DryRun: true, Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1, QueueWait: -1}}},
	} {
		err := r.g.SetPolicy(bad)
		if !errors.Is(err, bulkhead.ErrInvalidPolicy) {
			t.Fatalf("SetPolicy(%+v) = %v, want ErrInvalidPolicy", bad, err)
		}
		if got := r.g.Policy(); !reflect.DeepEqual(got, p) {
			t.Fatalf("after the invalid SetPolicy(%+v): Policy() = %+v, want %+v", bad, got, p)
		}
		if s, ws := r.g.Stats(), r.wstats(t, "batch"); s != before || ws != beforeW {
			t.Fatalf("after the invalid SetPolicy(%+v): stats %+v / %+v, want %+v / %+v", bad, s, ws, before, beforeW)
		}
		if _, ok := r.g.WorkloadStats("ok"); ok {
			t.Fatal("an invalid policy's workload was added")
		}
	}
	// The limits in force are still the old ones: batch at its B=1.
	_, err := r.db.ExecContext(bulkhead.WithWorkload(context.Background(), "batch"), "quick")
	wlRejected(t, "batch op after the invalid policies", err, bulkhead.ErrAdmissionFull, "batch", 1, 0)
	r.done(t, h1)
	rzSettled(t, r, 2)
}

func TestThePolicyInForceIsACopyOnBothSides(t *testing.T) {
	ws := map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1}}
	r := wlOpen(t, bulkhead.Policy{MaxConcurrent: 2, Workloads: ws})
	ws["batch"] = bulkhead.Workload{MaxConcurrent: 2}
	ws["other"] = bulkhead.Workload{MaxConcurrent: 1}
	got := r.g.Policy()
	got.Workloads["batch"] = bulkhead.Workload{MaxConcurrent: 2}
	got.Workloads["more"] = bulkhead.Workload{MaxConcurrent: 1}
	p := r.g.Policy()
	if len(p.Workloads) != 1 || p.Workloads["batch"].MaxConcurrent != 1 {
		t.Fatalf("Policy() = %+v after the caller changed the maps it passed and got: want batch B=1 alone", p)
	}
	if err := r.g.SetPolicy(bulkhead.Policy{MaxConcurrent: 2, Workloads: ws}); err != nil {
		t.Fatal(err)
	}
	ws["batch"] = bulkhead.Workload{MaxConcurrent: 1}
	if p := r.g.Policy(); p.Workloads["batch"].MaxConcurrent != 2 || len(p.Workloads) != 2 {
		t.Fatalf("Policy() = %+v after the caller changed the map given to SetPolicy", p)
	}
}

// A storm of operations while SetPolicy resizes, adds and removes: never
// more in the driver than the largest B set; at the end, exactly B.
func TestConcurrentResizingNeverLosesOrInventsPermits(t *testing.T) {
	const (
		workers    = 8
		ops        = 60
		maxResizes = 20000 // the resizer runs until the workers are done, at most this many times
		maxB       = 3
		maxBw      = 2
	)
	// "a" is in every policy, resized each time; "b" comes and goes (the
	// subject of TestAWorkloadRemovedAndAddedAgainKeepsCountingItsRunningOperations).
	policies := []bulkhead.Policy{
		{MaxConcurrent: 1, MaxQueue: 2, QueueWait: time.Millisecond,
			Workloads: map[string]bulkhead.Workload{"a": {MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Millisecond}}},
		{MaxConcurrent: 3, MaxQueue: 1, QueueWait: time.Millisecond,
			Workloads: map[string]bulkhead.Workload{"a": {MaxConcurrent: 2, MaxQueue: 1, QueueWait: time.Millisecond}}},
		{MaxConcurrent: 2, MaxQueue: 2, QueueWait: time.Millisecond,
			Workloads: map[string]bulkhead.Workload{"a": {MaxConcurrent: 1, MaxQueue: 2, QueueWait: time.Millisecond}, "b": {MaxConcurrent: 1}}},
		{MaxConcurrent: 3, MaxQueue: 0,
			Workloads: map[string]bulkhead.Workload{"a": {MaxConcurrent: 2}, "b": {MaxConcurrent: 2, MaxQueue: 1, QueueWait: time.Millisecond}}},
	}
	r := wlOpen(t, policies[0])
	var inDriver atomic.Int64
	perWl := map[string]*atomic.Int64{"a": {}}
	var firstErr atomic.Pointer[error]
	fail := func(err error) { firstErr.CompareAndSwap(nil, &err) }
	r.fc.SetHook(func(ctx context.Context, op fakedb.Op, q string) error {
		if q != "work" {
			return r.hook(ctx, op, q)
		}
		if n := inDriver.Add(1); n > maxB {
			fail(fmt.Errorf("%d operations in the driver, more than any B set (%d)", n, maxB))
		}
		defer inDriver.Add(-1)
		if name, _ := bulkhead.WorkloadFromContext(ctx); perWl[name] != nil {
			if n := perWl[name].Add(1); n > maxBw {
				fail(fmt.Errorf("%d operations of %q in the driver, more than any of its B (%d)", n, name, maxBw))
			}
			defer perWl[name].Add(-1)
		}
		runtime.Gosched()
		return nil
	})
	var wg sync.WaitGroup
	var okN, rejN atomic.Int64
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewSource(int64(w)))
			for range ops {
				ctx := context.Background()
				if name := []string{"a", "b", ""}[rng.Intn(3)]; name != "" {
					ctx = bulkhead.WithWorkload(ctx, name)
				}
				var err error
				if rng.Intn(2) == 0 {
					_, err = r.db.ExecContext(ctx, "work")
				} else {
					var tx interface{ Commit() error }
					if tx, err = r.db.BeginTx(ctx, nil); err == nil {
						err = tx.Commit()
					}
				}
				switch {
				case err == nil:
					okN.Add(1)
				case errors.Is(err, bulkhead.ErrRejected):
					rejN.Add(1)
				default:
					fail(err)
				}
			}
		})
	}
	var stop atomic.Bool
	var resized atomic.Int64
	resizer := make(chan struct{})
	go func() {
		defer close(resizer)
		for i := 0; i < maxResizes && !stop.Load(); i++ {
			if err := r.g.SetPolicy(policies[i%len(policies)]); err != nil {
				fail(err)
			}
			resized.Add(1)
			runtime.Gosched()
		}
	}()
	wg.Wait()
	stop.Store(true)
	<-resizer
	if e := firstErr.Load(); e != nil {
		t.Fatal(*e)
	}
	t.Logf("%d ok, %d rejected across %d resizes", okN.Load(), rejN.Load(), resized.Load())
	final := policies[3]
	rzSet(t, r.g, final)
	if s := r.g.Stats(); s.Running != 0 || s.Waiting != 0 {
		t.Fatalf("after the storm: %+v, want nothing held", s)
	}
	for _, name := range []string{"a", "b"} {
		if ws := r.wstats(t, name); ws.Running != 0 || ws.Waiting != 0 {
			t.Fatalf("workload %s after the storm: %+v, want nothing held", name, ws)
		}
	}
	rzFull(t, r, final.MaxConcurrent, "final", bulkhead.ErrRejected)
	if s := r.g.Stats(); s.Admitted != okN.Load()+int64(final.MaxConcurrent) {
		t.Fatalf("Admitted=%d, want %d", s.Admitted, okN.Load()+int64(final.MaxConcurrent))
	}
}

// No permit invented: those still running and the new ones stay within B.
func TestAWorkloadRemovedAndAddedAgainKeepsCountingItsRunningOperations(t *testing.T) {
	withBatch := bulkhead.Policy{MaxConcurrent: 4, Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1}}}
	r := wlOpen(t, withBatch)
	batch := bulkhead.WithWorkload(context.Background(), "batch")
	b1 := r.start(t, batch, "b1")
	rzSet(t, r.g, bulkhead.Policy{MaxConcurrent: 4})
	rzSet(t, r.g, withBatch)
	if ws := r.wstats(t, "batch"); ws.Running != 1 {
		t.Fatalf("batch added again while b1 runs: %+v, want b1 counted (Running 1)", ws)
	}
	_, err := r.db.ExecContext(batch, "quick")
	wlRejected(t, "second batch op with b1 still running", err, bulkhead.ErrAdmissionFull, "batch", 1, 0)
	r.done(t, b1)
	r.balanced(t)
}

func TestClosingTheGateMakesAnOperationQueuedInARemovedWorkloadReturnErrClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, _, b1, b2 := wlBatchQueued(t, 4, time.Hour)
		rzSet(t, r.g, bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 4, QueueWait: time.Hour})
		r.closeEnds(t, "an operation queued in a removed workload", b2)
		r.done(t, b1)
	})
}

// Running work keeps its permits; a policy change keeps the fallback, the
// next CapUntil puts b back.
func TestCapUntilFallsToItsFallbackWhenTheLeaseRunsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := wlOpen(t, bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 4, QueueWait: time.Hour})
		bg := context.Background()
		if err := r.g.CapUntil(bg, 3, 4, time.Now().Add(time.Second), 1); err != nil {
			t.Fatal(err)
		}
		rzFull(t, r, 3, "leased", bulkhead.ErrQueueTimeout)

		// Two run at the lease's end, a third waits for a permit.
		a, b := r.exec(bg, "a"), r.exec(bg, "b")
		r.await(t, "a", "b")
		time.Sleep(2 * time.Second) // the fake clock: the lease ran out
		c := r.exec(bg, "c")
		awaitState(t, "c waits", func() bool { return r.g.Stats().Waiting == 1 })
		if s := r.g.Stats(); s.MaxConcurrent != 1 || s.Running != 2 {
			t.Fatalf("after the lease: stats %+v, want B=1 with the 2 running kept", s)
		}
		r.done(t, a)
		synctest.Wait()
		if r.hasEntered("c") {
			t.Fatal("c started with 1 running and a fallback of 1")
		}
		r.done(t, b)
		r.await(t, "c")
		r.done(t, c)
		// README: ErrLeaseExpired, a fleet member's lease ran out before the
		// operation started.
		rzFull(t, r, 1, "fallback", bulkhead.ErrLeaseExpired)

		// A policy change keeps the lapsed lease's fallback; a renewal ends it.
		rzSet(t, r.g, bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 4, QueueWait: time.Hour})
		rzFull(t, r, 1, "setpolicy", bulkhead.ErrLeaseExpired)
		if err := r.g.CapUntil(bg, 3, 4, time.Now().Add(time.Second), 1); err != nil {
			t.Fatal(err)
		}
		rzFull(t, r, 3, "renewed", bulkhead.ErrQueueTimeout)
		if err := r.g.Cap(bg, -1, -1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		rzFull(t, r, 4, "uncapped", bulkhead.ErrQueueTimeout)
		if s := r.g.Stats(); s.RejectedLease != 2 {
			t.Fatalf("stats %+v, want the 2 refusals on the fallback counted as RejectedLease", s)
		}
	})
}

// Let in under the lease, its dial outlived it: ErrLeaseExpired, and its
// permits come back.
func TestAnOperationLetInUnderALeaseThatRanOutSendsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fc := fakedb.New()
		var inits atomic.Int64 // a fleet's tag is such a statement
		init := bulkhead.WithConnInit(func(context.Context, driver.Conn) error { inits.Add(1); return nil })
		e := fkOpen(t, fc, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 0, QueueWait: time.Hour}, init)
		bg := context.Background()
		if err := e.g.CapUntil(bg, 2, 0, time.Now().Add(time.Second), 0); err != nil {
			t.Fatal(err)
		}
		dial := fc.Block(fakedb.OpConnect)
		done := e.exec(bg, "quick")
		dial.Wait(1)
		time.Sleep(2 * time.Second) // the fake clock: the lease runs out during the dial
		if s := e.g.Stats(); s.MaxConcurrent != 0 {
			t.Fatalf("stats %+v after the lease ran out, want B at the fallback 0", s)
		}
		dial.Release()
		err := <-done
		var re *bulkhead.RejectedError
		if !errors.Is(err, bulkhead.ErrLeaseExpired) || !errors.Is(err, bulkhead.ErrRejected) || !errors.As(err, &re) {
			t.Fatalf("err = %v, want a rejection matching ErrLeaseExpired", err)
		}
		if n := fc.Count(fakedb.OpExec) + fc.Count(fakedb.OpPrepare) + fc.Count(fakedb.OpPing) + inits.Load(); n != 0 {
			t.Fatalf("the refused operation made %d driver calls (its connection's initialisation included) beyond the dial", n)
		}
		// README: ErrLeaseExpired, a fleet member's lease ran out before the
		// operation started: a new operation on the fallback share of 0 too.
		if _, err := e.db.ExecContext(bg, "quick"); !errors.Is(err, bulkhead.ErrLeaseExpired) || !errors.Is(err, bulkhead.ErrRejected) {
			t.Fatalf("the next operation: %v, want ErrLeaseExpired (the fallback is 0)", err)
		}
		if s := e.g.Stats(); s.Running != 0 || s.Admitted != 0 || s.RejectedLease != 2 || s.RejectedFull != 0 || s.MaxConcurrent != 0 {
			t.Fatalf("stats %+v, want nothing running, 2 refused for the lease, B at the fallback 0", s)
		}
	})
}

// docs/fleet.md: a member with no share rejects every operation at once,
// those queued as B falls to 0 included, whatever Q the cap leaves.
func TestAGateCappedToNoPermitRejectsAtOnceAndKeepsNobodyWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := wlOpen(t, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: time.Hour})
		bg := context.Background()
		a := r.exec(bg, "a")
		b := r.exec(bg, "b")
		synctest.Wait()
		c := r.exec(bg, "c") // queued
		synctest.Wait()
		start := time.Now()
		capped := make(chan error, 1)
		go func() { capped <- r.g.Cap(bg, 0, 2) }()
		synctest.Wait()
		err := testkit.Recv(t, "c", c.err)
		re := wlRejected(t, "an operation queued as B fell to 0", err, bulkhead.ErrAdmissionFull, "", 0, 0)
		if time.Since(start) != 0 || re.Waiting != 0 {
			t.Fatalf("c was refused after %v with %+v, want at once, nobody left waiting", time.Since(start), re)
		}
		_, err = r.db.ExecContext(bg, "quick")
		re = wlRejected(t, "a new operation with B=0", err, bulkhead.ErrAdmissionFull, "", 0, 0)
		if re.Waited != 0 || time.Since(start) != 0 {
			t.Fatalf("the new operation waited %v, want a refusal at once", re.Waited)
		}
		r.done(t, a, b)
		if err := <-capped; err != nil {
			t.Fatalf("Cap: %v, want nil once the running work ended", err)
		}
		if s := r.g.Stats(); s.Waiting != 0 || s.Running != 0 || s.RejectedFull != 2 || s.MaxConcurrent != 0 || s.MaxQueue != 0 {
			t.Fatalf("stats %+v, want 2 refused at once, B=0 and so Q=0 in force", s)
		}
	})
}
