//go:build go1.25

package bulkhead_test

// Dry-run: nothing rejected, waits or is refused a dial; what would have
// been is counted and reported. And switching it live.

import (
	"context"
	"testing"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// drRejects is an option recording the OnReject events in ev.
func drRejects(ev *testkit.Log[bulkhead.Event]) bulkhead.Option {
	return bulkhead.WithEvents(bulkhead.Events{OnReject: ev.Add})
}

func TestDryRunNeitherRejectsNorWaitsNorRefusesDialsButCountsWhatWouldHaveBeen(t *testing.T) {
	var ev testkit.Log[bulkhead.Event]
	// An hour of queue wait: an operation that waited would hang the test.
	p := bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: bulkhead.MaxQueueWait, DryRun: true}
	r := wlOpen(t, p, drRejects(&ev))
	held := r.startN(t, context.Background(), "h", 3) // B+Q = 2
	s := r.g.Stats()
	if !s.DryRun || s.Running != 3 || s.Waiting != 0 || s.Admitted != 3 || s.RejectedFull != 1 || s.RejectedTimeout != 0 || s.WouldWait < 1 {
		t.Fatalf("dry-run stats with 3 running, B=1, Q=1: %+v; want Running 3, Admitted 3, RejectedFull 1, WouldWait ≥ 1", s)
	}
	// The gate dialed a connection for each, and rejected nothing.
	if s.OpenConns != 3 || r.fc.Open() != 3 {
		t.Fatalf("dry-run connections: %+v, driver has %d open; want 3 open", s, r.fc.Open())
	}
	evs := ev.List()
	if len(evs) != 1 || !evs[0].DryRun || evs[0].Reason != bulkhead.ErrAdmissionFull || evs[0].Kind != bulkhead.KindExec {
		t.Fatalf("OnReject events %+v, want one dry-run admission-full for a statement", evs)
	}
	r.done(t, held...)
	drIdle(t, r) // every debt paid
	p.DryRun = false
	rzSet(t, r.g, p)
	rzFull(t, r, 1, "after", bulkhead.ErrRejected) // one permit, exactly
}

// drIdle fails unless nothing holds or waits (r.balanced needs the rig's
// own OnRelease recorder, which a WithEvents option replaces).
func drIdle(t *testing.T, r *wlRig) {
	t.Helper()
	if s := r.g.Stats(); s.Running != 0 || s.Waiting != 0 {
		t.Fatalf("after the end: %+v, want nothing held", s)
	}
}

// The third would have been refused, never waited: one wait, one refusal.
func TestDryRunCountsAnOperationThatWouldHaveBeenRefusedOnlyAsARefusal(t *testing.T) {
	p := bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: bulkhead.MaxQueueWait, DryRun: true}
	r := wlOpen(t, p)
	held := r.startN(t, context.Background(), "h", 3)
	if s := r.g.Stats(); s.RejectedFull != 1 || s.WouldWait != 1 {
		t.Fatalf("stats %+v: want RejectedFull 1 (h2) and WouldWait 1 (h1)", s)
	}
	r.done(t, held...)
}

func TestDryRunReportsAWorkloadsWouldBeRejectionsUnderItsName(t *testing.T) {
	var ev testkit.Log[bulkhead.Event]
	p := bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 0, DryRun: true,
		Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1}}}
	r := wlOpen(t, p, drRejects(&ev))
	held := r.startN(t, bulkhead.WithWorkload(context.Background(), "batch"), "b", 2)
	ws := r.wstats(t, "batch")
	if !ws.DryRun || ws.Running != 2 || ws.RejectedFull != 1 || ws.Admitted != 2 {
		t.Fatalf("batch in dry-run with 2 running, B=1: %+v; want Running 2, RejectedFull 1, Admitted 2", ws)
	}
	if s := r.g.Stats(); s.RejectedFull != 1 || s.Running != 2 {
		t.Fatalf("global %+v: want the workload's would-be rejection counted, 2 running", s)
	}
	if evs := ev.List(); len(evs) != 1 || !evs[0].DryRun || evs[0].Workload != "batch" || evs[0].Reason != bulkhead.ErrAdmissionFull {
		t.Fatalf("OnReject events %+v, want one dry-run admission-full of batch", evs)
	}
	r.done(t, held...)
	drIdle(t, r)
}

func TestSwitchingDryRunOffWithMoreRunningThanBMakesNewWorkWaitOrBeRejectedUntilRunningDropsBelowB(t *testing.T) {
	p := bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: bulkhead.MaxQueueWait, DryRun: true}
	r := wlOpen(t, p)
	bg := context.Background()
	held := r.startN(t, bg, "h", 3)
	p.DryRun = false
	rzSet(t, r.g, p)
	if s := r.g.Stats(); s.DryRun || s.Running != 3 {
		t.Fatalf("after switching dry-run off: %+v", s)
	}
	r.refusedFull(t, "new op with 3 running, B+Q=2")
	r.done(t, held[0])
	r.refusedFull(t, "new op with 2 running, B+Q=2")
	r.done(t, held[1])
	// One runs, B=1: the new op is admitted and waits.
	w := r.exec(bg, "w")
	awaitState(t, "w waits", func() bool { return r.g.Stats().Waiting == 1 })
	if r.hasEntered("w") {
		t.Fatal("w runs beside h2 with B=1")
	}
	r.done(t, held[2])
	r.await(t, "w")
	r.done(t, w)
	rzSettled(t, r, 1)
}

func TestSwitchingDryRunOnLetsEveryWaiterRunAtOnce(t *testing.T) {
	p := bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 2, QueueWait: bulkhead.MaxQueueWait,
		Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 1, MaxQueue: 1, QueueWait: bulkhead.MaxQueueWait}}}
	r := wlOpen(t, p)
	bg := context.Background()
	h := r.start(t, bg, "h")
	w1 := r.exec(bg, "w1")
	awaitState(t, "w1 waits", func() bool { return r.g.Stats().Waiting == 1 })
	w2 := r.exec(bulkhead.WithWorkload(bg, "batch"), "w2") // waits for the global permit, holding batch's
	awaitState(t, "w2 waits", func() bool { return r.g.Stats().Waiting == 2 })
	p.DryRun = true
	rzSet(t, r.g, p)
	r.await(t, "w1", "w2")
	if s := r.g.Stats(); s.Running != 3 || s.Waiting != 0 {
		t.Fatalf("after switching dry-run on: %+v, want the 2 waiters running", s)
	}
	r.done(t, h, w1, w2)
	r.balanced(t)
	p.DryRun = false
	rzSet(t, r.g, p)
	rzFull(t, r, 1, "after", bulkhead.ErrRejected)
	if ws := r.wstats(t, "batch"); ws.Running != 0 || ws.Waiting != 0 {
		t.Fatalf("batch after the end: %+v", ws)
	}
}

func TestDryRunWithQueueWaitZeroStillNeverRejects(t *testing.T) {
	p := bulkhead.Policy{MaxConcurrent: 1, DryRun: true}
	r := wlOpen(t, p)
	bg := context.Background()
	held := r.startN(t, bulkhead.WithQueueWait(bg, 0), "h", 2)
	if s := r.g.Stats(); s.RejectedFull != 1 || s.RejectedTimeout != 0 || s.Admitted != 2 {
		t.Fatalf("stats %+v", s)
	}
	if n := r.fc.Count(fakedb.OpConnect); n != 2 {
		t.Fatalf("%d dials, want 2", n)
	}
	r.done(t, held...)
	r.balanced(t)
}
