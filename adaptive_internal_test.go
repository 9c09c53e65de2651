//go:build go1.25

package bulkhead

// Policy.Adaptive: the limit in force through a budget and a gate
// (internal/adaptive tests the limit alone, on models of databases).

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// adWork is the hold time of an operation with no queueing inside the
// database.
const adWork = 10 * time.Millisecond

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
		l.observeLocked(adWork, adWork, l.b)
	}
	l.mu.Unlock()
	if r := testkit.Recv(t, "the waiter", res); r.err != nil {
		t.Fatalf("waiter when b grew: %v, want the new permit", r.err)
	}
	if s := admStats(l); s.MaxConcurrent != 2 || s.Running != 2 || s.Waiting != 0 || s.LastMove.To != 2 || s.LastMove.Why != "slow start" {
		t.Fatalf("stats %+v, want B=2 in force by slow start, 2 running", s)
	}
	l.release(0)
	l.release(0)
}

// Stats.MaxConcurrent is the B in force: MinConcurrent (1 for 0) at the
// start under Adaptive, the policy's without; workloads keep their own.
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
	for range 8 {
		if err := l.take(context.Background(), &passage{}); !errors.Is(err, ErrAdmissionFull) {
			t.Fatalf("admit with the one permit taken: %v, want ErrAdmissionFull", err)
		}
		l.mu.Lock()
		l.observeLocked(adWork, adWork, l.b)
		l.mu.Unlock()
	}
	if s := admStats(l); s.MaxConcurrent != 2 {
		t.Fatalf("b after a window of flat holds with callers refused: %d, want 2", s.MaxConcurrent)
	}
	l.release(0)
}

// 32 callers, 90 % of transactions holding 1 ms and 10 % 30 ms: a mix is
// not queueing.
func TestAdaptiveOnAMixOfTransactionsThatNeverQueueGoesToTheCeiling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var w dlWork
		g, db, fc := dlGate(t, Policy{MaxConcurrent: 16, MaxQueue: 64, QueueWait: time.Second, Adaptive: true})
		fc.SetHook(w.hook)
		halt := testkit.Repeat(32, func(i int) bool {
			q := "sleep 1ms"
			if i%10 == 9 {
				q = "sleep 30ms"
			}
			tx, err := db.BeginTx(context.Background(), nil)
			if err != nil {
				t.Error(err)
				return false
			}
			if _, err := tx.Exec(q); err != nil {
				t.Error(err)
			}
			tx.Commit()
			return true
		})
		var sum, n int
		for i := range 40 { // 4 s, B read every 100 ms from the second on
			time.Sleep(100 * time.Millisecond)
			if i >= 10 {
				sum += g.Stats().MaxConcurrent
				n++
			}
		}
		halt()
		if avg := float64(sum) / float64(n); avg < 14 {
			t.Fatalf("B averaged %.1f on a mix that never queues, want near the ceiling 16 (last move %+v)", avg, g.Stats().LastMove)
		}
	})
}
