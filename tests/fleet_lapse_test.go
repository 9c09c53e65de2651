package tests

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/fleet"
)

// An operation waiting in the queue of a member whose lease runs out with
// fallback 0 is sent away at once with ErrLeaseExpired as B falls to 0,
// with no other call on the gate to notice the lease's end: it does not
// wait out its queue wait.
func TestFleetMemberWhoseLeaseRunsOutSendsItsQueueAwayAtOnce(t *testing.T) {
	ctx := pgTestCtx(t)
	const total, queue = 2, 1
	p := fleetPolicy(total, queue)
	p.QueueWait = time.Minute // beyond relAwait's bound: a waiter left in the queue is a failure
	d := newFleetStallDialer()
	m := fleetJoin(t, fleetName(t), p, stdlib.GetConnector(*pgConfig(t)), fleet.Interval(500*time.Millisecond), fleet.Fallback(0), dialedCoordination(t, d.dial))
	t.Cleanup(d.heal) // before the member leaves: its loop waits for the stalled round
	g, db := m.Gate(), m.Gate().OpenDB()
	awaitState(t, "the member's share of 2", func() bool { return g.Stats().MaxConcurrent == total })
	pgBegin(t, ctx, db)
	pgBegin(t, ctx, db)
	waiter := make(chan error, 1)
	go func() { waiter <- fleetOps[0].run(ctx, db) }()
	awaitState(t, "one operation queued behind two transactions", func() bool { return g.Stats().Waiting == 1 })
	d.stall()
	// From here nothing calls the gate: neither Stats nor an operation.
	fleetRefusal(t, "the operation queued as the lease ran out", relAwait(t, "the operation queued as the lease ran out", waiter), bulkhead.ErrLeaseExpired, 0, 0, true)
}
