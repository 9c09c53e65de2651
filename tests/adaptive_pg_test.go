package tests

// Adaptive B and the deadline-bounded wait on PostgreSQL through pgxgate:
// the sessions stay as adaptive B moves, and a waiter leaves the
// queue while two of its class's holds are still left before its deadline,
// having sent nothing.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
)

// adMoves records the moves of adaptive B, each with when it was made,
// since the option was made.
type adMoves struct {
	mu    sync.Mutex
	start time.Time
	moves []bulkhead.Move
	at    []time.Duration // since start
}

func (m *adMoves) option() bulkhead.Option {
	m.start = time.Now()
	return bulkhead.WithEvents(bulkhead.Events{OnLimit: func(mv bulkhead.Move) {
		m.mu.Lock()
		m.moves = append(m.moves, mv)
		m.at = append(m.at, time.Since(m.start))
		m.mu.Unlock()
	}})
}

func (m *adMoves) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := ""
	for i, mv := range m.moves {
		if i == 24 {
			s += fmt.Sprintf(" … (%d in all)", len(m.moves))
			break
		}
		s += fmt.Sprintf(" %v:%d→%d(%s)", m.at[i].Round(time.Millisecond), mv.From, mv.To, mv.Why)
	}
	return s
}

// adSampleB lets the load run for d, reading g's B in force every 50 ms,
// and returns the samples.
func adSampleB(g *bulkhead.Gate, d time.Duration) []int {
	var bs []int
	for end := time.Now().Add(d); time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond) // the load runs
		bs = append(bs, g.Stats().MaxConcurrent)
	}
	return bs
}

func adMean(bs []int) float64 {
	sum := 0
	for _, b := range bs {
		sum += b
	}
	return float64(sum) / float64(max(len(bs), 1))
}

// adRefusals counts rejections by cause.
type adRefusals struct{ full, timeout, late, other atomic.Int64 }

// add counts err if it is a rejection, the caller then backing off a
// millisecond, as a client would, instead of spinning; it reports whether
// err was one.
func (r *adRefusals) add(err error) bool {
	var re *bulkhead.RejectedError
	if !errors.As(err, &re) {
		return false
	}
	switch re.Cause {
	case bulkhead.ErrAdmissionFull:
		r.full.Add(1)
	case bulkhead.ErrQueueTimeout:
		r.timeout.Add(1)
	case bulkhead.ErrWouldMissDeadline:
		r.late.Add(1)
	default:
		r.other.Add(1)
	}
	time.Sleep(time.Millisecond)
	return true
}

func (r *adRefusals) String() string {
	return fmt.Sprintf("refused: %d full, %d queue timeout, %d late, %d other", r.full.Load(), r.timeout.Load(), r.late.Load(), r.other.Load())
}

// adCall runs call and counts its outcome: rejections in r, the rest in n
// (past: it ran, but returned after the deadline d).
func adCall(n *estCounts, r *adRefusals, d time.Duration, call func() error) {
	start := time.Now()
	err := call()
	if r.add(err) {
		return
	}
	if n.add(err) && time.Since(start) >= d {
		n.past.Add(1)
	}
}

// The sessions stay with adaptive B under steady load: 8 callers in a
// closed loop of SELECT pg_sleep(0.01), ceiling 16 (none waits once B is
// 8): after a warm-up second, at most one dial per 10 s (here at most one
// in 3 s).
func TestOnPostgreSQLAdaptiveKeepsItsSessionsUnderSteadyLoad(t *testing.T) {
	ctx := pgTestCtx(t)
	var moves adMoves
	g, db := estGate(t, bulkhead.Policy{MaxConcurrent: 16, MaxQueue: 16, QueueWait: 50 * time.Millisecond, Adaptive: true}, moves.option())
	var n estCounts
	var r adRefusals
	stop := estCallers(t, 8, func(_, _ int) {
		adCall(&n, &r, time.Second, func() error { return estExec(ctx, db, time.Second, "SELECT pg_sleep(0.01)") })
	})
	adSampleB(g, time.Second) // the warm-up
	warm := g.Stats()
	bs := adSampleB(g, 3*time.Second)
	end := g.Stats()
	stop()
	dials := end.Dials - warm.Dials
	t.Logf("figures: %d dials in the 3 s after the first second (%d before), %d ran in them; B %d after the warm-up, then averaged %.2f (min %d, max %d); in all: %v; %v; open %d, bad %d; moves:%v",
		dials, warm.Dials, end.Admitted-warm.Admitted, warm.MaxConcurrent, adMean(bs), slices.Min(bs), slices.Max(bs), &n, &r, end.OpenConns, end.BadConns, &moves)
	if dials > 1 {
		t.Fatalf("%d dials in 3 s after the first second (B from %d, moves:%v), want at most 1", dials, warm.MaxConcurrent, &moves)
	}
	if n.other.Load() != 0 || end.Admitted-warm.Admitted < 100 {
		t.Fatalf("%v; want nothing failed, and at least 100 run in the span", &n)
	}
}

// A waiter leaves the queue once its deadline leaves less than two of its
// class's holds: with B = 1 held by a long statement, a statement measured
// holding its permit about 50 ms (an insert after pg_sleep(0.05)), with a
// 400 ms deadline, is refused with ErrWouldMissDeadline before its
// deadline, two of its holds left; with a queue wait shorter than that,
// with ErrQueueTimeout. Neither reached the server: its row was never
// inserted, nothing was dialed or admitted.
func TestOnPostgreSQLAWaiterLeavesTheQueueWithTwoOfItsClassesHoldsLeft(t *testing.T) {
	ctx := pgTestCtx(t)
	admin := openURL(t, postgresURL(t), 1)
	table := tempTable(t, admin, "k text NOT NULL")
	var h estHolds
	g, db := estGate(t, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 4, QueueWait: 5 * time.Second, Adaptive: true, MinConcurrent: 1}, h.option())
	insert := "INSERT INTO " + table + " SELECT $1::text FROM pg_sleep(0.05)"
	rows := func(k string) int {
		t.Helper()
		var n int
		if err := admin.QueryRowContext(ctx, "SELECT count(*) FROM "+table+" WHERE k = $1", k).Scan(&n); err != nil {
			t.Fatalf("count the rows of %s: %v", table, err)
		}
		return n
	}
	const d = 400 * time.Millisecond
	for _, c := range []struct {
		name  string
		wait  time.Duration // the caller's queue wait; 0: the policy's
		cause error
	}{
		{"its deadline", 0, bulkhead.ErrWouldMissDeadline},
		{"a shorter queue wait", 100 * time.Millisecond, bulkhead.ErrQueueTimeout},
	} {
		// Measure the insert's hold: one at a time, each measured (Adaptive).
		for range 8 {
			if _, err := db.ExecContext(ctx, insert, "measured"); err != nil {
				t.Fatalf("measuring the insert: %v", err)
			}
		}
		holds := h.take()

		admitted := g.Stats().Admitted
		long := goExec(db, ctx, "SELECT pg_sleep(1)")
		awaitState(t, "the long statement holds the permit and its session", func() bool {
			s := g.Stats()
			return s.Running == 1 && s.Admitted == admitted+1
		})
		before := g.Stats()
		cctx := ctx
		if c.wait > 0 {
			cctx = bulkhead.WithQueueWait(ctx, c.wait)
		}
		dctx, cancel := context.WithTimeout(cctx, d)
		dl, _ := dctx.Deadline()
		_, err := db.ExecContext(dctx, insert, "refused")
		returned := time.Now()
		cancel()
		after := g.Stats()
		var rej *bulkhead.RejectedError
		if !errors.As(err, &rej) || rej.Cause != c.cause || !errors.Is(err, bulkhead.ErrRejected) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: %v, want a *RejectedError with Cause %v, not the context's error", c.name, err, c.cause)
		}
		t.Logf("figures: %s: the insert held its permit %v to %v (median %v); refused %v before its deadline of %v after a wait of %v (Hold %v, Left %v): %v",
			c.name, holds[0], holds[len(holds)-1], estQuantile(holds, 0.5), dl.Sub(returned), d, rej.Waited, rej.Hold, rej.Left, err)
		if !returned.Before(dl) {
			t.Fatalf("%s: the rejection returned %v after its deadline, want before it", c.name, returned.Sub(dl))
		}
		if c.cause == bulkhead.ErrWouldMissDeadline && (rej.Left != 2*rej.Hold || rej.Hold < 50*time.Millisecond || rej.Waited <= 0) {
			t.Fatalf("%s: rejection %+v, want it judged after a wait on its class's hold of 50ms or more, with twice it left", c.name, *rej)
		}
		if after.Dials != before.Dials || after.Admitted != before.Admitted || after.Running != 1 {
			t.Fatalf("%s: stats %+v (before %+v), want no dial, no admission, the long statement still running", c.name, after, before)
		}
		if err := <-long; err != nil {
			t.Fatalf("the long statement: %v", err)
		}
		if n := rows("refused"); n != 0 {
			t.Fatalf("%s: %d rows of the refused insert in %s once the permit was free, want 0: it reached the server", c.name, n, table)
		}
		h.take() // the long statement's hold
	}
	if n := rows("measured"); n != 16 {
		t.Fatalf("%d rows of the measured inserts, want 16", n)
	}
}
