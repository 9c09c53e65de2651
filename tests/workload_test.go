package tests

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// wlLatency summarises waits: count, p50, p99, max.
func wlLatency(ds []time.Duration) (p50, p99, maxd time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return at(0.50), at(0.99), s[len(s)-1]
}

// The test, on PostgreSQL: a batch workload (B_w=2) saturated with
// long transactions and a full queue does not take the interactive work's
// share of the global budget. Interactive operations (untagged, with their
// own per-operation wait) run B−B_w at a time and are never rejected; the
// batch workload never has more than 2 transactions on the server.
func TestInteractiveWorkIsAdmittedWhileABatchWorkloadSitsAtItsLimitOnPostgres(t *testing.T) {
	const (
		batchWorkers = 6 // > B_w+Q_w: the batch workload also meets rejections
		// = B − B_w. Every worker holds at most one connection: 6+2 = B+Q,
		// so no dial is ever refused.
		interactiveWorkers = 2
		interactiveOps     = 150
		interactiveWait    = 500 * time.Millisecond
	)
	p := bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 4, QueueWait: time.Second,
		Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 2, MaxQueue: 2, QueueWait: 50 * time.Millisecond}}}
	var mu sync.Mutex
	var interactiveWaits []time.Duration
	batchReleased := make(chan struct{}, batchWorkers)
	g, db := openGated(t, p, bulkhead.WithEvents(bulkhead.Events{
		OnAdmit: func(e bulkhead.Event) {
			if e.Workload == "" {
				mu.Lock()
				interactiveWaits = append(interactiveWaits, e.Waited)
				mu.Unlock()
			}
		},
		OnRelease: func(e bulkhead.Event) {
			if e.Workload == "batch" {
				select {
				case batchReleased <- struct{}{}:
				default:
				}
			}
		},
	}))
	m := newMonitor(t)
	ctx := t.Context()
	batch := bulkhead.WithWorkload(ctx, "batch")

	stop := make(chan struct{}) // closed before haltBatch: wakes a rejected worker
	var batchOK, batchRejected, batchOther atomic.Int64
	var batchErr atomic.Value
	haltBatch := testkit.Repeat(batchWorkers, func(int) bool {
		err := testkit.Tx(batch, db, "SELECT pg_sleep(0.2)")
		switch {
		case err == nil:
			batchOK.Add(1)
		case errors.Is(err, bulkhead.ErrRejected):
			var re *bulkhead.RejectedError
			if errors.As(err, &re) && re.Workload != "batch" {
				batchErr.Store(errors.New("batch rejected by the global budget: " + err.Error()))
			}
			batchRejected.Add(1)
			// A rejected caller tries again once a batch transaction
			// ended, instead of spinning.
			select {
			case <-stop:
				return false
			case <-batchReleased:
			}
		default:
			batchOther.Add(1)
			batchErr.Store(err)
		}
		return true
	})
	// Interactive work starts once the batch workload is at its limit.
	awaitState(t, "the batch workload runs at its limit with a full queue", func() bool {
		ws, _ := g.WorkloadStats("batch")
		return ws.Running == 2 && ws.Waiting == 2
	})

	stopPoll := serverPeak(t, ctx, m.db, `SELECT count(*), '' FROM pg_stat_activity WHERE application_name = $1 AND state <> 'idle'
	        AND xact_start < statement_timestamp() AND query LIKE '%pg_sleep(0.2)%' AND pid <> pg_backend_pid()`, m.app)

	var interactiveRejected, interactiveFailed atomic.Int64
	var iwg sync.WaitGroup
	for range interactiveWorkers {
		iwg.Go(func() {
			ictx := bulkhead.WithQueueWait(ctx, interactiveWait)
			for range interactiveOps {
				var one int
				err := db.QueryRowContext(ictx, "SELECT 1 FROM pg_sleep(0.005)").Scan(&one)
				switch {
				case err == nil:
				case errors.Is(err, bulkhead.ErrRejected):
					interactiveRejected.Add(1)
				default:
					interactiveFailed.Add(1)
				}
			}
		})
	}
	iwg.Wait()
	close(stop)
	haltBatch()
	peakBatchServer, _, _ := stopPoll()

	ws, _ := g.WorkloadStats("batch")
	s := g.Stats()
	mu.Lock()
	waits := slices.Clone(interactiveWaits)
	mu.Unlock()
	p50, p99, maxw := wlLatency(waits)
	t.Logf("interactive: %d ops, %d rejected, %d failed; wait p50 %v, p99 %v, max %v (own bound %v)",
		len(waits), interactiveRejected.Load(), interactiveFailed.Load(), p50, p99, maxw, interactiveWait)
	t.Logf("batch: %d committed, %d rejected (workload stats: admitted %d, full %d, timeout %d); peak batch transactions on the server %d",
		batchOK.Load(), batchRejected.Load(), ws.Admitted, ws.RejectedFull, ws.RejectedTimeout, peakBatchServer)
	t.Logf("global: %+v", s)

	if v := batchErr.Load(); v != nil {
		t.Fatalf("batch: %v", v)
	}
	if interactiveRejected.Load() != 0 || interactiveFailed.Load() != 0 {
		t.Fatalf("%d interactive ops rejected, %d failed: want none while B−B_w permits are theirs",
			interactiveRejected.Load(), interactiveFailed.Load())
	}
	if len(waits) != interactiveWorkers*interactiveOps {
		t.Fatalf("%d interactive admissions, want %d", len(waits), interactiveWorkers*interactiveOps)
	}
	if maxw > interactiveWait {
		t.Fatalf("an interactive op waited %v, beyond its own bound %v", maxw, interactiveWait)
	}
	if batchRejected.Load() == 0 || ws.RejectedFull+ws.RejectedTimeout == 0 {
		t.Fatal("the batch workload was never rejected: it was not saturated")
	}
	if n := peakBatchServer; n > 2 {
		t.Fatalf("%d batch transactions on the server at once, want at most B_w=2", n)
	}
	if s.Running != 0 || s.Waiting != 0 || ws.Running != 0 || ws.Waiting != 0 {
		t.Fatalf("after the end: global %+v, batch %+v: want nothing held", s, ws)
	}
}
