//go:build go1.25

package bulkhead_test

// Workloads: each named workload has its own budget inside the global one.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// wlRig is a gate on the fake driver whose Exec or Query of "hold NAME"
// stays in the driver until finish(NAME) or its context's end; others
// return at once. It records, in order, the held operations that entered.
type wlRig struct {
	*fkEnv
	mu      sync.Mutex
	gates   map[string]chan struct{}
	entered []string
	wg      sync.WaitGroup
	hook    fakedb.Hook // the fake driver's hook that holds "hold NAME"
}

func wlOpen(t *testing.T, p bulkhead.Policy, opts ...bulkhead.Option) *wlRig {
	t.Helper()
	r := &wlRig{gates: map[string]chan struct{}{}}
	fc := fakedb.New()
	r.hook = func(ctx context.Context, op fakedb.Op, query string) error {
		name, ok := strings.CutPrefix(query, "hold ")
		if !ok || (op != fakedb.OpExec && op != fakedb.OpQuery) {
			return nil
		}
		select {
		case <-r.enter(name):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	fc.SetHook(r.hook)
	r.fkEnv = fkOpen(t, fc, p, opts...)
	// Cleanups run last-in first-out: this one, before fkOpen's db.Close.
	t.Cleanup(func() {
		r.mu.Lock()
		for _, ch := range r.gates {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
		r.gates = nil // later holds pass at once
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

// enter records that the held operation name entered the driver and
// returns its gate, closed when it may return.
func (r *wlRig) enter(name string) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.entered = append(r.entered, name)
	return r.gateLocked(name)
}

func (r *wlRig) gateLocked(name string) chan struct{} {
	if r.gates == nil {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	ch, ok := r.gates[name]
	if !ok {
		ch = make(chan struct{})
		r.gates[name] = ch
	}
	return ch
}

// wlOp is a held operation the rig started: its name, and its error once
// it returned.
type wlOp struct {
	name string
	err  <-chan error
}

// spawn runs f, the operation name, on a goroutine.
func (r *wlRig) spawn(name string, f func() error) wlOp {
	ch := make(chan error, 1)
	r.wg.Go(func() { ch <- f() })
	return wlOp{name, ch}
}

// exec starts db.ExecContext(ctx, "hold "+name) on a goroutine.
func (r *wlRig) exec(ctx context.Context, name string) wlOp {
	return r.spawn(name, func() error {
		_, err := r.db.ExecContext(ctx, "hold "+name)
		return err
	})
}

// wlBatchQueued opens a rig, in a synctest bubble, of B=Q=n and a workload
// "batch" of B=Q=1: b1 holds the batch permit and b2 waits for it.
func wlBatchQueued(t *testing.T, n int, wait time.Duration) (r *wlRig, batch context.Context, b1, b2 wlOp) {
	t.Helper()
	r = wlOpen(t, bulkhead.Policy{MaxConcurrent: n, MaxQueue: n, QueueWait: wait,
		Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1, MaxQueue: 1, QueueWait: wait}}})
	batch = bulkhead.WithWorkload(context.Background(), "batch")
	b1 = r.exec(batch, "b1")
	synctest.Wait()
	b2 = r.exec(batch, "b2")
	synctest.Wait()
	return r, batch, b1, b2
}

// closeEnds closes the gate, in a synctest bubble, and fails unless the
// queued op returns ErrClosed at once, not a rejection.
func (r *wlRig) closeEnds(t *testing.T, what string, op wlOp) {
	t.Helper()
	if err := r.g.Close(); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	select {
	case err := <-op.err:
		if !errors.Is(err, bulkhead.ErrClosed) || errors.Is(err, bulkhead.ErrRejected) {
			t.Fatalf("%s after Close: %v, want ErrClosed", what, err)
		}
	default:
		t.Fatalf("%s still waits after Gate.Close", what)
	}
}

// refusedFull fails the test unless a new operation is refused with
// ErrAdmissionFull; what says when.
func (r *wlRig) refusedFull(t *testing.T, what string) {
	t.Helper()
	if _, err := r.db.ExecContext(context.Background(), "quick"); !errors.Is(err, bulkhead.ErrAdmissionFull) {
		t.Fatalf("%s: %v, want admission full", what, err)
	}
}

// start starts exec and returns once the operation runs in the driver.
func (r *wlRig) start(t *testing.T, ctx context.Context, name string) wlOp {
	t.Helper()
	op := r.exec(ctx, name)
	r.await(t, name)
	return op
}

// startN starts n operations named prefix0 to prefix(n-1) one after
// another, each running in the driver before the next starts.
func (r *wlRig) startN(t *testing.T, ctx context.Context, prefix string, n int) []wlOp {
	t.Helper()
	ops := make([]wlOp, n)
	for i := range n {
		ops[i] = r.start(t, ctx, fmt.Sprintf("%s%d", prefix, i))
	}
	return ops
}

// tx starts a transaction that runs "hold "+name (taking no permit of
// its own) and commits.
func (r *wlRig) tx(ctx context.Context, name string) wlOp {
	return r.spawn(name, func() error { return testkit.Tx(ctx, r.db, "hold "+name) })
}

// finish lets the held operation name return.
func (r *wlRig) finish(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ch := r.gateLocked(name)
	select {
	case <-ch:
	default:
		close(ch)
	}
}

func (r *wlRig) hasEntered(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.entered, name)
}

func (r *wlRig) enteredOrder() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.entered)
}

// await waits until the held operations names are inside the driver.
func (r *wlRig) await(t *testing.T, names ...string) {
	t.Helper()
	for _, name := range names {
		awaitState(t, name+" runs in the driver", func() bool { return r.hasEntered(name) })
	}
}

// wstats returns the named workload's stats, failing if there is none.
func (r *wlRig) wstats(t *testing.T, name string) bulkhead.Stats {
	t.Helper()
	s, ok := r.g.WorkloadStats(name)
	if !ok {
		t.Fatalf("WorkloadStats(%q): no such workload", name)
	}
	return s
}

// wlRejected fails the test unless err is a *RejectedError with the given
// cause naming the given workload ("" for the global budget) and limits.
func wlRejected(t *testing.T, what string, err error, cause error, workload string, b, q int) *bulkhead.RejectedError {
	t.Helper()
	var re *bulkhead.RejectedError
	if !errors.As(err, &re) || !errors.Is(err, bulkhead.ErrRejected) || !errors.Is(err, cause) {
		t.Fatalf("%s: %v, want a rejection with %v", what, err, cause)
	}
	if re.Workload != workload || re.MaxConcurrent != b || re.MaxQueue != q {
		t.Fatalf("%s: %+v, want Workload %q, MaxConcurrent %d, MaxQueue %d", what, re, workload, b, q)
	}
	return re
}

// done lets the held operations return, then fails the test unless each
// returned nil.
func (r *wlRig) done(t *testing.T, ops ...wlOp) {
	t.Helper()
	for _, op := range ops {
		r.finish(op.name)
	}
	for _, op := range ops {
		if err := testkit.Recv(t, op.name, op.err); err != nil {
			t.Fatalf("%s: %v", op.name, err)
		}
	}
}

var wlBatch = bulkhead.Policy{
	MaxConcurrent: 3, MaxQueue: 0,
	Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1, MaxQueue: 0}},
}

func TestAWorkloadAtItsLimitRejectsItsOwnWorkWhileUntaggedWorkIsStillAdmitted(t *testing.T) {
	r := wlOpen(t, wlBatch)
	bg := context.Background()
	batch := bulkhead.WithWorkload(bg, "batch")

	b1 := r.start(t, batch, "b1")
	execs := r.fc.Count(fakedb.OpExec)
	_, err := r.db.ExecContext(batch, "quick")
	re := wlRejected(t, "second batch op", err, bulkhead.ErrAdmissionFull, "batch", 1, 0)
	if !strings.Contains(re.Error(), `workload "batch"`) {
		t.Fatalf("%q does not name the workload", re.Error())
	}
	if n := r.fc.Count(fakedb.OpExec); n != execs {
		t.Fatalf("the rejected batch op reached the driver (%d execs, want %d)", n, execs)
	}

	// The batch workload is at its limit: untagged work still runs, up to
	// the global B.
	u1, u2 := r.exec(bg, "u1"), r.exec(bg, "u2")
	r.await(t, "u1", "u2")
	_, err = r.db.ExecContext(bg, "quick")
	wlRejected(t, "untagged op beyond the global B+Q", err, bulkhead.ErrAdmissionFull, "", 3, 0)

	ws, s := r.wstats(t, "batch"), r.g.Stats()
	if ws.Running != 1 || ws.Admitted != 1 || ws.RejectedFull != 1 || ws.MaxConcurrent != 1 || ws.MaxQueue != 0 || ws.OpenConns != 0 {
		t.Fatalf("batch stats %+v: want Running 1, Admitted 1, RejectedFull 1, B=1, Q=0, OpenConns 0", ws)
	}
	// The global budget counts every operation, whatever its workload.
	if s.Running != 3 || s.Admitted != 3 || s.RejectedFull != 2 {
		t.Fatalf("global stats %+v: want Running 3, Admitted 3, RejectedFull 2", s)
	}
	r.done(t, b1, u1, u2)
	r.balanced(t)
	if ws := r.wstats(t, "batch"); ws.Running != 0 || ws.Waiting != 0 {
		t.Fatalf("batch stats after the end %+v: want nothing running or waiting", ws)
	}
}

func TestAWorkloadTransactionHoldsTheWorkloadsPermitUntilCommit(t *testing.T) {
	r := wlOpen(t, wlBatch)
	batch := bulkhead.WithWorkload(context.Background(), "batch")
	tx := r.tx(batch, "t1")
	r.await(t, "t1")
	_, err := r.db.ExecContext(batch, "quick")
	wlRejected(t, "batch op while a batch transaction is open", err, bulkhead.ErrAdmissionFull, "batch", 1, 0)
	r.done(t, tx)
	if _, err := r.db.ExecContext(batch, "quick"); err != nil {
		t.Fatalf("batch op after the commit: %v", err)
	}
	r.balanced(t)
	if ws := r.wstats(t, "batch"); ws.Admitted != 2 || ws.Running != 0 || ws.RejectedFull != 1 {
		t.Fatalf("batch stats %+v: want Admitted 2, Running 0, RejectedFull 1", ws)
	}
}

func TestUntaggedWorkAndWorkNamingAnUnknownWorkloadPassTheGlobalBudgetAlone(t *testing.T) {
	r := wlOpen(t, wlBatch)
	bg := context.Background()
	b1 := r.start(t, bulkhead.WithWorkload(bg, "batch"), "b1")
	ghost := bulkhead.WithWorkload(bg, "ghost")
	g1, g2 := r.exec(ghost, "g1"), r.exec(ghost, "g2")
	r.await(t, "g1", "g2")
	_, err := r.db.ExecContext(ghost, "quick")
	wlRejected(t, "unknown workload beyond the global B+Q", err, bulkhead.ErrAdmissionFull, "", 3, 0)
	if _, ok := r.g.WorkloadStats("ghost"); ok {
		t.Fatal(`WorkloadStats("ghost") is ok for a workload the policy does not list`)
	}
	if _, ok := r.g.WorkloadStats(""); ok {
		t.Fatal(`WorkloadStats("") is ok`)
	}
	r.done(t, b1, g1, g2)
	r.balanced(t)
	if ws := r.wstats(t, "batch"); ws.Admitted != 1 {
		t.Fatalf("batch stats %+v: the unknown workload's ops counted in batch", ws)
	}
	// Visible: counted, and the name logged once.
	if s := r.g.Stats(); s.UnknownWorkload != 3 {
		t.Fatalf("stats %+v: want the 3 operations naming an unknown workload counted", s)
	}
}

// A typo is counted in Stats.UnknownWorkload and logged once, with the
// names the policy knows.
func TestAnUnknownWorkloadNameIsCountedAndLoggedOnce(t *testing.T) {
	buf := captureLog(t)
	r := wlOpen(t, wlBatch)
	ctx := bulkhead.WithWorkload(context.Background(), "bacth")
	for range 3 {
		testkit.Exec(t, ctx, r.db, "quick")
	}
	if s := r.g.Stats(); s.UnknownWorkload != 3 || s.Admitted != 3 {
		t.Fatalf("stats %+v: want 3 operations admitted in the global budget, 3 counted as naming an unknown workload", s)
	}
	out := buf.String()
	if n := strings.Count(out, "workload=bacth"); n != 1 || !strings.Contains(out, "known=[batch]") {
		t.Fatalf("log %q: want the unknown name logged once, with the known ones", out)
	}
}

// In a synctest bubble the clock is fake: waits take exactly their
// length, and synctest.Wait returns once every goroutine is blocked.

func TestAWorkloadQueueTimeoutNamesTheWorkloadAndCountsInItsStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 4, QueueWait: time.Hour,
			Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1, MaxQueue: 1, QueueWait: 40 * time.Millisecond}}}
		r := wlOpen(t, p)
		batch := bulkhead.WithWorkload(context.Background(), "batch")
		b1 := r.exec(batch, "b1")
		synctest.Wait()
		start := time.Now()
		_, err := r.db.ExecContext(batch, "quick")
		re := wlRejected(t, "queued batch op", err, bulkhead.ErrQueueTimeout, "batch", 1, 1)
		if re.Waited != 40*time.Millisecond || time.Since(start) != 40*time.Millisecond {
			t.Fatalf("%+v after %v: want the workload's 40ms wait", re, time.Since(start))
		}
		ws, s := r.wstats(t, "batch"), r.g.Stats()
		if ws.RejectedTimeout != 1 || ws.WaitCount != 1 || ws.WaitDuration != 40*time.Millisecond || ws.QueueWait != 40*time.Millisecond {
			t.Fatalf("batch stats %+v: want RejectedTimeout 1, WaitCount 1, WaitDuration 40ms", ws)
		}
		if s.RejectedTimeout != 1 || s.WaitCount != 1 || s.WaitDuration != 40*time.Millisecond {
			t.Fatalf("global stats %+v: want the workload's timeout counted too", s)
		}
		r.done(t, b1)
		r.balanced(t)
	})
}

// The time queued for the workload's permit is not given again for the
// global one.
func TestAWorkloadsQueueWaitCoversItsWaitForBothBudgets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: time.Hour,
			Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1, MaxQueue: 1, QueueWait: 100 * time.Millisecond}}}
		r := wlOpen(t, p)
		bg := context.Background()
		batch := bulkhead.WithWorkload(bg, "batch")
		b1 := r.exec(batch, "b1") // the workload's permit and a global one
		u1 := r.exec(bg, "u1")    // the other global permit
		synctest.Wait()
		start := time.Now()
		b2 := r.exec(batch, "b2") // queued for the workload's permit
		synctest.Wait()
		time.Sleep(60 * time.Millisecond) // fake time
		u2 := r.exec(bg, "u2")            // queued for a global permit
		synctest.Wait()
		if s := r.g.Stats(); s.Waiting != 1 {
			t.Fatalf("global stats %+v: want u2 waiting", s)
		}
		// b1 ends: its global permit goes to u2, first in the global
		// queue; b2 gets the workload's permit and queues for a global one.
		r.done(t, b1)
		synctest.Wait()
		if !r.hasEntered("u2") || r.hasEntered("b2") {
			t.Fatalf("entered %v: want u2 to run and b2 to wait", r.enteredOrder())
		}
		err := testkit.Recv(t, "b2", b2.err)
		re := wlRejected(t, "b2, out of time in the global queue", err, bulkhead.ErrQueueTimeout, "", 2, 2)
		if got := time.Since(start); re.Waited != 100*time.Millisecond || got != 100*time.Millisecond {
			t.Fatalf("b2 waited %v (returned after %v), want the workload's 100ms in all", re.Waited, got)
		}
		if ws := r.wstats(t, "batch"); ws.Running != 0 || ws.Waiting != 0 {
			t.Fatalf("batch stats %+v: the failed op kept a workload permit", ws)
		}
		r.done(t, u1, u2)
		r.balanced(t)
	})
}

func TestContextOptionsComposeAndReadBack(t *testing.T) {
	bg := context.Background()
	if name, ok := bulkhead.WorkloadFromContext(bg); ok || name != "" {
		t.Fatalf("WorkloadFromContext(Background) = %q, %v; want none", name, ok)
	}
	ctx := bulkhead.WithQueueWait(bulkhead.WithWorkload(bg, "batch"), time.Millisecond)
	if name, ok := bulkhead.WorkloadFromContext(ctx); !ok || name != "batch" {
		t.Fatalf("after WithQueueWait: WorkloadFromContext = %q, %v; want batch", name, ok)
	}
	ctx = bulkhead.WithWorkload(ctx, "report")
	if name, _ := bulkhead.WorkloadFromContext(ctx); name != "report" {
		t.Fatalf("the inner WithWorkload wins: got %q, want report", name)
	}
	if name, ok := bulkhead.WorkloadFromContext(bulkhead.WithWorkload(ctx, "")); ok || name != "" {
		t.Fatalf(`WithWorkload(ctx, "") = %q, %v; want none`, name, ok)
	}
}

// An unknown name reaches no event, or a collector keyed by it (promgate)
// would make a series per name the callers invent.
func TestEventsNameTheBudgetsWorkloadConsistentlyForAnUnknownName(t *testing.T) {
	var ev testkit.Log[bulkhead.Event]
	r := wlOpen(t, bulkhead.Policy{MaxConcurrent: 1, Workloads: wlBatch.Workloads},
		bulkhead.WithEvents(bulkhead.Events{OnAdmit: ev.Add, OnReject: ev.Add, OnRelease: ev.Add}))
	ghost := bulkhead.WithWorkload(context.Background(), "ghost")
	g1 := r.start(t, ghost, "g1")
	if _, err := r.db.ExecContext(ghost, "quick"); !errors.Is(err, bulkhead.ErrRejected) {
		t.Fatalf("second op: %v, want a rejection", err)
	}
	r.done(t, g1)
	seen := ev.List()
	if len(seen) != 3 {
		t.Fatalf("events %+v, want admit, reject, release", seen)
	}
	for _, e := range seen {
		if e.Workload != "" {
			t.Fatalf("event %+v names the unknown workload; events %+v", e, seen)
		}
	}
}

// WorkloadStats' doc: the workload's counters hold "the operations it
// decided (its own rejections, and those of the global budget met by its
// operations)".
func TestARejectionByTheGlobalBudgetCountsInTheWorkloadsStats(t *testing.T) {
	// Q=1 with a 1ns wait: the batch op gets a connection and an admission
	// permit, then no execution permit (a full admission would be refused
	// at the dial, before any budget sees the operation).
	p := bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Nanosecond, Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1}}}
	r := wlOpen(t, p)
	bg := context.Background()
	u1 := r.start(t, bg, "u1") // the only global execution permit
	_, err := r.db.ExecContext(bulkhead.WithWorkload(bg, "batch"), "quick")
	wlRejected(t, "batch op with no global permit free", err, bulkhead.ErrQueueTimeout, "", 1, 1)
	if ws := r.wstats(t, "batch"); ws.RejectedTimeout != 1 {
		t.Fatalf("batch stats %+v: want the global rejection of its op counted (RejectedTimeout 1)", ws)
	}
	r.done(t, u1)
}

func TestClosingTheGateMakesAnOperationQueuedForItsWorkloadReturnErrClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, batch, b1, b2 := wlBatchQueued(t, 2, bulkhead.MaxQueueWait) // b2 queued for the workload's permit
		if ws := r.wstats(t, "batch"); ws.Waiting != 1 {
			t.Fatalf("batch stats %+v: want b2 queued", ws)
		}
		r.closeEnds(t, "an operation queued for its workload's permit", b2)
		if _, err := r.db.ExecContext(batch, "quick"); !errors.Is(err, bulkhead.ErrClosed) {
			t.Fatalf("new batch op after Close: %v, want ErrClosed", err)
		}
		r.done(t, b1)
		if s, ws := r.g.Stats(), r.wstats(t, "batch"); s.Running != 0 || s.Waiting != 0 || ws.Running != 0 || ws.Waiting != 0 {
			t.Fatalf("after the end: global %+v, batch %+v: want nothing held", s, ws)
		}
	})
}

// README: when the database has room nothing is shed and everyone is
// served, whatever the priority of those queued in a workload.
func TestOperationsQueuedInAWorkloadLeaveTheGlobalPermitsToOtherWork(t *testing.T) {
	for _, prio := range []int{-10, 0, 10} {
		t.Run(fmt.Sprintf("batch priority %d", prio), func(t *testing.T) {
			r := wlOpen(t, bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 1, QueueWait: time.Hour,
				Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1, MaxQueue: 2, QueueWait: time.Hour, Priority: prio}}})
			batch := bulkhead.WithWorkload(context.Background(), "batch")
			b1 := r.start(t, batch, "b1")
			b2 := r.exec(batch, "b2")
			awaitState(t, "b2 queued in batch", func() bool { return r.wstats(t, "batch").Waiting == 1 })
			b3 := r.exec(batch, "b3")
			awaitState(t, "b3 queued in batch", func() bool { return r.wstats(t, "batch").Waiting == 2 })

			// One global permit is free and the global queue is empty: an
			// operation of no workload runs at once.
			if _, err := r.db.ExecContext(context.Background(), "quick"); err != nil {
				t.Fatalf("an operation of no workload beside a full batch queue: %v, want it run", err)
			}
			if s := r.g.Stats(); s.RejectedFull != 0 || s.Running != 1 || s.Waiting != 0 {
				t.Fatalf("global stats %+v: want nothing refused, b1 alone running, nobody waiting", s)
			}
			r.done(t, b1, b2, b3)
			if ws := r.wstats(t, "batch"); ws.RejectedFull != 0 || ws.Admitted != 3 {
				t.Fatalf("batch stats %+v: want its three operations admitted, none shed", ws)
			}
			r.balanced(t)
		})
	}
}

// A shed must buy a run: not when the arrival may not wait, or cannot
// make its deadline.
func TestAHigherPriorityArrivalShedsNobodyWhenItWouldBeRefusedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour,
			Workloads: map[string]bulkhead.Workload{
				"low":  {MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour},
				"high": {MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour, Priority: 1},
			}}
		r := wlOpen(t, p)
		bg := context.Background()
		low := bulkhead.WithWorkload(bg, "low")
		high := bulkhead.WithWorkload(bg, "high")
		u := r.exec(bg, "u")
		synctest.Wait()
		l := r.exec(low, "l") // queued in the global budget
		synctest.Wait()

		// No queue wait: it would be refused at once, so it sheds nobody.
		_, err := r.db.ExecContext(bulkhead.WithQueueWait(high, 0), "quick")
		wlRejected(t, "a high-priority arrival that may not wait", err, bulkhead.ErrAdmissionFull, "", 1, 1)
		if s := r.g.Stats(); s.Waiting != 1 {
			t.Fatalf("global stats %+v: want the low waiter still queued", s)
		}

		// l runs 100ms (its hold is measured: it waited), with u2 and l2
		// behind it; then a deadline of 20ms cannot be made.
		r.done(t, u)
		synctest.Wait()
		u2 := r.exec(bg, "u2")
		synctest.Wait()
		time.Sleep(100 * time.Millisecond)
		r.done(t, l)
		synctest.Wait()
		l2 := r.exec(low, "l2")
		synctest.Wait()
		if s := r.g.Stats(); s.Waiting != 1 || s.Hold < 50*time.Millisecond {
			t.Fatalf("global stats %+v: want u2 running, l2 waiting, a hold of about 100ms", s)
		}
		ctx, cancel := context.WithTimeout(high, 20*time.Millisecond)
		defer cancel()
		_, err = r.db.ExecContext(ctx, "hold l") // its class's hold: l's
		if !errors.Is(err, bulkhead.ErrRejected) {
			t.Fatalf("a high-priority arrival whose deadline is a fifth of the hold: %v, want a rejection", err)
		}
		if s := r.g.Stats(); s.Waiting != 1 {
			t.Fatalf("global stats %+v: want the low waiter still queued", s)
		}
		if ws := r.wstats(t, "low"); ws.RejectedFull != 0 {
			t.Fatalf("low stats %+v: want nothing of it shed", ws)
		}
		r.done(t, u2, l2)
		r.balanced(t)
	})
}
