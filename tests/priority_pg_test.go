package tests

// Workload priorities on PostgreSQL through pgx: under a full budget the
// lower priority is shed and the higher served first.

import (
	"errors"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// With B=1 and Q=1 held by a transaction and a low-priority operation
// queued, a high-priority operation sheds the low one (ErrAdmissionFull,
// having run nothing) and runs once the transaction commits; with the
// budget free again, the low priority is served as before.
func TestAHigherPriorityShedsTheLowerOneAndRunsFirstOnPostgreSQL(t *testing.T) {
	ctx, g, db := pgOpen(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: 10 * time.Second, Workloads: map[string]bulkhead.Workload{
		"high": {MaxConcurrent: 1, MaxQueue: 1, QueueWait: 10 * time.Second, Priority: 1},
		"low":  {MaxConcurrent: 1, MaxQueue: 1, QueueWait: 10 * time.Second},
	}})
	low := bulkhead.WithWorkload(ctx, "low")
	high := bulkhead.WithWorkload(ctx, "high")
	holder := pgBegin(t, ctx, db)
	lowDone := goExec(db, low, "SELECT 1")
	awaitState(t, "the low-priority operation waits", func() bool { return g.Stats().Waiting == 1 })
	highDone := goExec(db, high, "SELECT 1")
	if err := testkit.Recv(t, "the shed low-priority operation", lowDone); !errors.Is(err, bulkhead.ErrAdmissionFull) {
		t.Fatalf("low-priority operation: %v, want ErrAdmissionFull (shed)", err)
	}
	awaitState(t, "the high-priority operation waits", func() bool { return g.Stats().Waiting == 1 })
	if s, _ := g.WorkloadStats("low"); s.RejectedFull != 1 || s.Admitted != 0 {
		t.Fatalf("low workload %+v, want one RejectedFull and nothing admitted", s)
	}
	txCommit(t, holder)
	if err := <-highDone; err != nil {
		t.Fatalf("high-priority operation: %v, want it run", err)
	}
	if _, err := db.ExecContext(low, "SELECT 1"); err != nil {
		t.Fatalf("low-priority operation with the budget free: %v, want it run", err)
	}
	if s, _ := g.WorkloadStats("high"); s.Admitted != 1 {
		t.Fatalf("high workload %+v, want one admitted", s)
	}
	awaitState(t, "every permit back", func() bool { s := g.Stats(); return s.Running == 0 && s.Waiting == 0 })
}
