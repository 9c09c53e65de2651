package bulkhead

// Workload priorities in the global budget.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// prGo starts an operation of priority prio through l; it counts among
// l's waiters once queued.
func prGo(l *budget, prio int) <-chan admResult {
	return admGoPass(context.Background(), l, passage{prio: prio})
}

// prQueue starts prGo and returns once it is the nth waiter of l.
func prQueue(t *testing.T, l *budget, prio, n int) <-chan admResult {
	t.Helper()
	return admQueue(t, context.Background(), l, passage{prio: prio}, n)
}

func TestAHigherPriorityIsServedFirstFIFOWithinAPriority(t *testing.T) {
	l := newBudget("")
	l.resize(1, 4, time.Hour, false, 0)
	admMustAcquire(t, l)
	low1 := prQueue(t, l, 0, 1)
	low2 := prQueue(t, l, 0, 2)
	high1 := prQueue(t, l, 1, 3)
	high2 := prQueue(t, l, 1, 4)
	for i, ch := range []<-chan admResult{high1, high2, low1, low2} {
		l.release(0)
		if r := testkit.Recv(t, "waiter", ch); r.err != nil {
			t.Fatalf("waiter %d in the order high, high, low, low: %v", i, r.err)
		}
	}
	l.release(0)
	if s := admStats(l); s.Running != 0 || s.Waiting != 0 || admRead(l).admitted != 0 {
		t.Fatalf("state %+v after all released, want nothing held", s)
	}
}

func TestAFullAdmissionShedsTheYoungestWaiterOfTheLowestPriority(t *testing.T) {
	l := newBudget("")
	l.resize(1, 3, time.Hour, false, 0)
	admMustAcquire(t, l)
	lowOld := prQueue(t, l, -1, 1)
	lowYoung := prQueue(t, l, -1, 2)
	mid := prQueue(t, l, 0, 3)
	high := prGo(l, 1) // admission is full: it sheds lowYoung
	r := testkit.Recv(t, "the youngest of the lowest priority", lowYoung)
	var re *RejectedError
	if !errors.As(r.err, &re) || !errors.Is(r.err, ErrAdmissionFull) || !errors.Is(r.err, ErrRejected) {
		t.Fatalf("shed waiter: %v, want a rejection matching ErrAdmissionFull", r.err)
	}
	admWaitFor(t, func() bool { return admRead(l).waiting == 3 })
	if s := admRead(l); s.admitted != 4 {
		t.Fatalf("admitted %d after the shed, want 4: the permit passed to the new operation", s.admitted)
	}
	// Equal priority sheds nobody. (The context's end only keeps a gate
	// that shed and queued it from holding the test for the hour.)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := l.take(ctx, &passage{prio: -1, limit: time.Hour}); !errors.Is(err, ErrAdmissionFull) {
		t.Fatalf("an operation of priority -1 with admission full and the lowest waiter at -1: %v", err)
	}
	for i, ch := range []<-chan admResult{high, mid, lowOld} {
		l.release(0)
		if r := testkit.Recv(t, "waiter", ch); r.err != nil {
			t.Fatalf("waiter %d in the order high, mid, low: %v", i, r.err)
		}
	}
	l.release(0)
	if s := admStats(l); s.RejectedFull != 1 || s.Running != 0 || s.Waiting != 0 {
		t.Fatalf("stats %+v, want the shed counted as RejectedFull (admit alone counts nothing), nothing held", s)
	}
	if s := admRead(l); s.admitted != 0 {
		t.Fatalf("admitted %d after all released, want 0", s.admitted)
	}
}

// A waiter shed from the global budget gives back the permits it held in
// its workload's budget, and none in the global one: that one passed on.
func TestAShedWaiterGivesBackItsWorkloadsPermits(t *testing.T) {
	g := newBudget("")
	g.resize(1, 1, time.Hour, false, 0)
	wl := newBudget("low")
	wl.resize(1, 1, time.Hour, false, 0)
	admMustAcquire(t, g)
	ch := make(chan error, 1)
	go func() {
		ps := passage{limit: time.Hour}
		ch <- ps.acquire(context.Background(), []*budget{wl, g})
	}()
	admWaitFor(t, func() bool { return admRead(g).waiting == 1 })
	high := prGo(g, 1)
	if err := <-ch; !errors.Is(err, ErrAdmissionFull) {
		t.Fatalf("shed: %v, want ErrAdmissionFull", err)
	}
	if s := admRead(wl); s.admitted != 0 || admStats(wl).Running != 0 {
		t.Fatalf("workload budget %+v after the shed, want nothing held", s)
	}
	admWaitFor(t, func() bool { return admRead(g).waiting == 1 })
	if s := admRead(g); s.admitted != 2 {
		t.Fatalf("global admitted %d, want 2 (the running one and the new one)", s.admitted)
	}
	g.release(0)
	if r := testkit.Recv(t, "high", high); r.err != nil {
		t.Fatal(r.err)
	}
	g.release(0)
}

// It holds nothing of the global budget: both are served in turn.
func TestAWaiterQueuedInItsWorkloadIsNotShedForAGlobalPermitItDoesNotHold(t *testing.T) {
	g, _, _ := dlGate(t, Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour, Workloads: map[string]Workload{
		"high": {MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour, Priority: 1},
		"low":  {MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Hour},
	}})
	low := WithWorkload(context.Background(), "low")
	high := WithWorkload(context.Background(), "high")
	var running permit
	if err := g.acquire(low, KindExec, "", &running); err != nil {
		t.Fatal(err)
	}
	queued := make(chan error, 1)
	var lp permit
	go func() { queued <- g.acquire(low, KindExec, "", &lp) }()
	lowBudget := g.workload("low")
	admWaitFor(t, func() bool { return admStats(lowBudget).Waiting == 1 })
	if s := admRead(g.global); s.waiting != 0 || s.admitted != 1 {
		t.Fatalf("global %+v, want only the running operation admitted: the low waiter queues in its workload's budget", s)
	}
	got := make(chan error, 1)
	var hp permit
	go func() { got <- g.acquire(high, KindExec, "", &hp) }()
	admWaitFor(t, func() bool { return admStats(g.global).Waiting == 1 })
	g.release(&running)
	if err := <-got; err != nil {
		t.Fatalf("the high operation: %v, want the permit", err)
	}
	g.release(&hp)
	if err := <-queued; err != nil {
		t.Fatalf("the low waiter: %v, want the permit after the high one", err)
	}
	g.release(&lp)
	for _, l := range []*budget{g.global, lowBudget, g.workload("high")} {
		if s := admStats(l); s.Running != 0 || s.Waiting != 0 || admRead(l).admitted != 0 || s.RejectedFull != 0 {
			t.Fatalf("budget %q: %+v admitted %d after all released, want nothing held nor shed", l.name, s, admRead(l).admitted)
		}
	}
}
