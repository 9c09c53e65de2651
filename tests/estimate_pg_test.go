package tests

// The hold estimates and adaptive B on PostgreSQL through pgxgate: each
// kind of work is judged by its own holds, which no outlier, lock or
// caller's cancellation keeps wrong for long; adaptive B reads queueing,
// not a mix; and under load the gate keeps its server connections.

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
	"github.com/dbbulkhead/bulkhead/pgxgate"
)

// estGate opens a gate on the test server through pgxgate, its *sql.DB
// closed at the end of the test.
func estGate(t *testing.T, p bulkhead.Policy, opts ...bulkhead.Option) (*bulkhead.Gate, *sql.DB) {
	t.Helper()
	return gateOn(t, pgxgate.Connector(pgConfig(t)), p, opts...)
}

// estSlowCancels is a dialer whose cancel requests reach the server d late,
// as a busy server's: a statement given up on holds its permits until the
// server acknowledged its cancel request (pgxgate).
func estSlowCancels(d time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		return &estSlowCancel{Conn: c, d: d}, err
	}
}

type estSlowCancel struct {
	net.Conn
	d       time.Duration
	written bool
}

func (c *estSlowCancel) Write(b []byte) (int, error) {
	if !c.written && len(b) >= 8 && binary.BigEndian.Uint32(b[4:8]) == 80877102 { // a cancel request
		time.Sleep(c.d)
	}
	c.written = true
	return c.Conn.Write(b)
}

// estEveryOneMeasured is a policy of b permits under which every hold is
// measured (Adaptive) and B stays b.
func estEveryOneMeasured(b int) bulkhead.Policy {
	return bulkhead.Policy{MaxConcurrent: b, MaxQueue: 4 * b, QueueWait: time.Second, Adaptive: true, MinConcurrent: b}
}

// estHolds records the holds OnRelease reports for autocommit statements.
type estHolds struct {
	mu   sync.Mutex
	held []time.Duration
}

func (h *estHolds) option() bulkhead.Option {
	return bulkhead.WithEvents(bulkhead.Events{OnRelease: func(e bulkhead.Event) {
		if e.Kind == bulkhead.KindExec {
			h.mu.Lock()
			h.held = append(h.held, e.Held)
			h.mu.Unlock()
		}
	}})
}

// take returns the holds recorded since the last take, sorted.
func (h *estHolds) take() []time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.held
	h.held = nil
	slices.Sort(s)
	return s
}

// estQuantile returns the q-quantile of sorted, 0 if empty.
func estQuantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[int(q*float64(len(sorted)-1))]
}

// estCalibrate runs query k times on each of n callers at once, without a
// deadline, and returns the holds measured, sorted (h records only them).
func estCalibrate(t *testing.T, ctx context.Context, db *sql.DB, h *estHolds, n, k int, query string, args ...any) []time.Duration {
	t.Helper()
	h.take()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			for range k {
				if _, err := db.ExecContext(ctx, query, args...); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("calibrating %s: %v", query, err)
	}
	return h.take()
}

// estCounts counts the outcomes of calls with a deadline.
type estCounts struct {
	ok, past, late, cut, other atomic.Int64 // past: ran, but returned after their deadline
	mu                         sync.Mutex
	firstLate, firstOther      error
}

// exec runs query with a deadline d from now and counts its outcome.
func (c *estCounts) exec(ctx context.Context, db *sql.DB, d time.Duration, query string, args ...any) {
	start := time.Now()
	if c.add(estExec(ctx, db, d, query, args...)) && time.Since(start) >= d {
		c.past.Add(1)
	}
}

// add counts err and reports whether the call ran.
func (c *estCounts) add(err error) bool {
	switch {
	case err == nil:
		c.ok.Add(1)
		return true
	case errors.Is(err, bulkhead.ErrWouldMissDeadline):
		c.late.Add(1)
		c.mu.Lock()
		if c.firstLate == nil {
			c.firstLate = err
		}
		c.mu.Unlock()
	case errors.Is(err, context.DeadlineExceeded):
		c.cut.Add(1)
	default:
		c.other.Add(1)
		c.mu.Lock()
		if c.firstOther == nil {
			c.firstOther = err
		}
		c.mu.Unlock()
	}
	return false
}

func (c *estCounts) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := fmt.Sprintf("%d ran (%d returned past their deadline), %d refused as late, %d cut off at their deadline, %d failed", c.ok.Load(), c.past.Load(), c.late.Load(), c.cut.Load(), c.other.Load())
	if c.firstLate != nil {
		s += fmt.Sprintf(" (first refused: %v)", c.firstLate)
	}
	if c.firstOther != nil {
		s += fmt.Sprintf(" (first failed: %v)", c.firstOther)
	}
	return s
}

// estCallers starts n callers, caller c making its i-th call as call(c, i),
// until the returned stop is called (or the test ends); stop returns once
// they all have.
func estCallers(t *testing.T, n int, call func(c, i int)) (stop func()) {
	stop = sync.OnceFunc(testkit.Repeat(n, func(i int) bool { call(i%n, i/n); return true }))
	t.Cleanup(stop)
	return stop
}

// estExec runs query with a deadline d from now.
func estExec(ctx context.Context, db *sql.DB, d time.Duration, query string, args ...any) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	_, err := db.ExecContext(ctx, query, args...)
	return err
}

// A mix of short and long statements is judged by each kind's own hold:
// pg_sleep(0.001) beside 10 % of pg_sleep(0.03), from callers with a permit
// each, every hold measured; no statement whose deadline is ten times its
// own text's hold is refused as late.
func TestOnPostgreSQLInAMixNoCallIsRefusedWhoseDeadlineIsTenTimesItsOwnHold(t *testing.T) {
	ctx := pgTestCtx(t)
	var h estHolds
	const callers = 4
	g, db := estGate(t, estEveryOneMeasured(callers), h.option())
	const short, long = "SELECT pg_sleep(0.001)", "SELECT pg_sleep(0.03)"
	hs := estCalibrate(t, ctx, db, &h, callers, 50, short)
	hl := estCalibrate(t, ctx, db, &h, callers, 3, long)
	dShort, dLong := 10*estQuantile(hs, 0.5), 10*estQuantile(hl, 0.5)

	var s, l estCounts
	dials := g.Stats().Dials
	stop := estCallers(t, callers, func(c, i int) {
		if (c+i)%10 == 9 {
			l.exec(ctx, db, dLong, long)
		} else {
			s.exec(ctx, db, dShort, short)
		}
	})
	time.Sleep(3 * time.Second) // the load runs
	stop()
	mix := h.take()
	t.Logf("figures: pg_sleep(0.001) held its permit %v median, %v at the 90th percentile (%d callers, alone); deadline %v; pg_sleep(0.03) %v, deadline %v; in the mix, holds %v median, %v p99, %d dials; short: %v; long: %v",
		estQuantile(hs, 0.5), estQuantile(hs, 0.9), callers, dShort, estQuantile(hl, 0.5), dLong, estQuantile(mix, 0.5), estQuantile(mix, 0.99), g.Stats().Dials-dials, &s, &l)
	if s.late.Load() != 0 || l.late.Load() != 0 || s.other.Load() != 0 || l.other.Load() != 0 {
		t.Fatalf("short: %v; long: %v; want none refused as late and none failed", &s, &l)
	}
	if s.ok.Load() < 500 || l.ok.Load() < 20 {
		t.Fatalf("short: %v; long: %v; want at least 500 and 20 run: the mix did not happen", &s, &l)
	}
}

// After one statement a thousand times slower than the rest (pg_sleep(1)
// among pg_sleep(0.001)s), of its own text or the same text with another
// argument, no call whose deadline is ten times its class's usual hold is
// refused as late, during it or once it completed.
func TestOnPostgreSQLAfterOneStatementAThousandTimesSlowerNoCallWithTenTimesItsHoldIsRefused(t *testing.T) {
	const fast = "SELECT pg_sleep($1::float8)"
	for _, c := range []struct {
		name string
		slow string
		args []any
	}{
		{"its own text", "SELECT pg_sleep(1)", nil},
		{"the same text", fast, []any{1.0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := pgTestCtx(t)
			var h estHolds
			_, db := estGate(t, estEveryOneMeasured(2), h.option())
			hf := estCalibrate(t, ctx, db, &h, 2, 50, fast, 0.001)
			d := 10 * estQuantile(hf, 0.5)

			var before, after estCounts
			var slowErr error
			slowDone := make(chan struct{})
			var done atomic.Bool
			stop := estCallers(t, 2, func(caller, i int) {
				if caller == 0 && i == 100 {
					slowErr = estExec(ctx, db, 2*time.Second, c.slow, c.args...)
					done.Store(true)
					close(slowDone)
					return
				}
				counts := &before
				if done.Load() {
					counts = &after
				}
				counts.exec(ctx, db, d, fast, 0.001)
			})
			<-slowDone
			time.Sleep(1500 * time.Millisecond) // the load runs on after it
			stop()
			holds := h.take()
			t.Logf("figures: pg_sleep(0.001) held its permit %v median (2 callers, alone), deadline %v; the slow statement held %v; up to its end: %v; after: %v",
				estQuantile(hf, 0.5), d, estQuantile(holds, 1), &before, &after)
			if slowErr != nil {
				t.Fatalf("the slow statement: %v, want it run", slowErr)
			}
			if before.late.Load() != 0 || after.late.Load() != 0 || before.other.Load() != 0 || after.other.Load() != 0 {
				t.Fatalf("up to the slow statement's end: %v; after: %v; want none refused as late, none failed", &before, &after)
			}
			if after.ok.Load() < 200 {
				t.Fatalf("after the slow statement: %v; want at least 200 run", &after)
			}
		})
	}
}

// A lock held 3 s by another session: statements on the table with 2 s
// deadlines are cut off at them, then refused as late; once the lock is
// released, a call runs within a second, and none fails after that.
func TestOnPostgreSQLAfterALockCallsRunAgainWithinASecondOfItsRelease(t *testing.T) {
	ctx := pgTestCtx(t)
	m := newMonitor(t)
	table := tempTable(t, m.db, "id int")
	query := "SELECT pg_sleep(0.005), count(*) FROM " + table // one pg_sleep even on the empty table
	g, db := estGate(t, bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 16, QueueWait: 2 * time.Second})

	type call struct {
		start, end time.Time
		err        error
	}
	var (
		mu    sync.Mutex
		calls []call
	)
	stop := estCallers(t, 8, func(_, _ int) {
		start := time.Now()
		err := estExec(ctx, db, 2*time.Second, query)
		mu.Lock()
		calls = append(calls, call{start, time.Now(), err})
		mu.Unlock()
		if err != nil {
			time.Sleep(10 * time.Millisecond) // a caller backs off a little
		}
	})
	time.Sleep(time.Second) // the load runs unlocked
	lock := testkit.Begin(t, ctx, m.db)
	testkit.Exec(t, ctx, lock, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE")
	locked := time.Now()
	time.Sleep(3 * time.Second) // the lock is held
	txCommit(t, lock)
	released := time.Now()
	time.Sleep(2500 * time.Millisecond) // the load runs on after it
	stop()

	var during, after estCounts
	var firstOK, lastFail time.Duration = -1, -1
	for _, c := range calls {
		switch {
		case c.end.Before(locked):
		case c.start.Before(released): // ended after the lock was taken, started before its release
			during.add(c.err)
		default:
			since := c.start.Sub(released)
			if after.add(c.err) {
				if firstOK < 0 || c.end.Sub(released) < firstOK {
					firstOK = c.end.Sub(released)
				}
			} else {
				lastFail = max(lastFail, since)
			}
		}
	}
	t.Logf("figures: during the lock: %v; after its release: %v; the first call started after the release ran by %v after it, the last one that failed started %v after it (-1: none); stats %+v",
		&during, &after, firstOK, lastFail, g.Stats())
	if during.cut.Load() == 0 || during.late.Load() == 0 {
		t.Fatalf("during the lock: %v; want calls cut off at their deadline, then refused as late: the scenario did not happen", &during)
	}
	// The promise is a time bound: calls run again within a second of the
	// release. The statements the lock held complete at its release, and
	// their holds replace the cut-off ones; else a refusing class lets a
	// probe go 250 ms (probeGap) after the last ended, and a fast probe
	// restarts its estimate. 1.5 s leaves half a second to a busy 2-core
	// machine under -race, where a probe may be scheduled late; before the
	// per-class estimates no call ran for the 2.5 s after the release.
	const bound = 1500 * time.Millisecond
	if firstOK < 0 || firstOK > bound {
		t.Fatalf("the first call started after the release ran %v after it (-1: none), want within %v (after: %v)", firstOK, bound, &after)
	}
	if lastFail > bound {
		t.Fatalf("a call started %v after the release failed, want none after %v (after: %v)", lastFail, bound, &after)
	}
}

// Statements cancelled by their callers mid-flight keep their permits
// while pgxgate's cancel request stops them (pgx then pauses 100 ms): that
// is no part of their work, and does not raise their text's estimate.
// Afterwards, calls of that text with a deadline of four times its real
// hold are not refused.
func TestOnPostgreSQLStatementsCancelledByTheirCallersDoNotRaiseTheirClassesEstimate(t *testing.T) {
	ctx := pgTestCtx(t)
	var h estHolds
	const callers = 4
	cfg := pgConfig(t)
	cfg.DialFunc = estSlowCancels(100 * time.Millisecond)
	_, db := gateOn(t, pgxgate.Connector(cfg), estEveryOneMeasured(callers), h.option())
	const query = "SELECT pg_sleep(0.01)"
	alone := estCalibrate(t, ctx, db, &h, callers, 10, query)
	d := 4 * estQuantile(alone, 0.5)

	var gaveUp, cancelled atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for i := range 16 {
				cctx, cancel := context.WithCancel(ctx)
				if i%2 == 1 {
					time.AfterFunc(3*time.Millisecond, cancel) // given up on mid-statement: each caller has its own permit
				}
				_, err := db.ExecContext(cctx, query)
				if cctx.Err() != nil {
					gaveUp.Add(1)
				}
				cancel()
				switch {
				case err == nil: // also once given up: the cancel request came too late
				case errors.Is(err, context.Canceled):
					cancelled.Add(1)
				default:
					t.Errorf("call %d: %v, want it run or cancelled", i, err)
				}
			}
		})
	}
	wg.Wait()
	mixed := h.take()
	slow := 0 // holds through a cancel request, which the server acknowledges 100 ms late
	for _, held := range mixed {
		if held >= 50*time.Millisecond {
			slow++
		}
	}

	var after estCounts
	for range callers {
		wg.Go(func() {
			for range 20 {
				after.exec(ctx, db, d, query)
			}
		})
	}
	wg.Wait()
	t.Logf("figures: pg_sleep(0.01) held its permit %v median (%d callers), deadline %v; %d of %d calls given up on by their callers (%d returned context.Canceled), %d holds of 50ms or more (median of all %v, longest %v); afterwards: %v",
		estQuantile(alone, 0.5), callers, d, gaveUp.Load(), 16*callers, cancelled.Load(), slow, estQuantile(mixed, 0.5), estQuantile(mixed, 1), &after)
	if gaveUp.Load() == 0 || int64(2*slow) < gaveUp.Load() {
		t.Fatalf("%d given up on, %d held their permits 50ms or more: want most given up on mid-statement, holding their permits through the cancel request", gaveUp.Load(), slow)
	}
	if after.late.Load() != 0 || after.other.Load() != 0 || after.ok.Load() < 70 {
		t.Fatalf("afterwards, with a deadline of %v: %v; want none refused as late, none failed", d, &after)
	}
}

// Adaptive B reads queueing, not a mix: 16 callers, always some waiting,
// run transactions of pg_sleep(0.001), one in ten pg_sleep(0.03): sleeps,
// which do not queue for anything inside PostgreSQL. B (ceiling 8) stays
// near the ceiling, and Stats().LastMove says why.
func TestOnPostgreSQLAdaptiveOnAMixOfTransactionsThatNeverQueueStaysNearTheCeiling(t *testing.T) {
	ctx := pgTestCtx(t)
	var (
		mu    sync.Mutex
		moves []bulkhead.Move
	)
	g, db := estGate(t, bulkhead.Policy{MaxConcurrent: 8, MaxQueue: 16, QueueWait: time.Second, Adaptive: true},
		bulkhead.WithEvents(bulkhead.Events{OnLimit: func(m bulkhead.Move) {
			mu.Lock()
			moves = append(moves, m)
			mu.Unlock()
		}}))
	var txs, failed atomic.Int64
	stop := estCallers(t, 16, func(c, i int) {
		q := "SELECT pg_sleep(0.001)"
		if (c+i)%10 == 9 {
			q = "SELECT pg_sleep(0.03)"
		}
		if err := testkit.Tx(ctx, db, q); err != nil {
			failed.Add(1)
			return
		}
		txs.Add(1)
	})
	var bs []int
	for i := range 40 { // 4 s, B read every 100 ms from the second on
		time.Sleep(100 * time.Millisecond)
		if i >= 10 {
			bs = append(bs, g.Stats().MaxConcurrent)
		}
	}
	stop()
	avg := adMean(bs)
	s := g.Stats()
	mu.Lock()
	why := map[string]int{}
	for _, m := range moves {
		why[m.Why]++
	}
	mu.Unlock()
	t.Logf("figures: B averaged %.2f (min %d, max %d) over %d samples after the first second; %d transactions committed, %d failed; moves %v; last move %+v",
		avg, slices.Min(bs), slices.Max(bs), len(bs), txs.Load(), failed.Load(), why, s.LastMove)
	if failed.Load() != 0 {
		t.Fatalf("%d transactions failed, want none: callers never exceed B+Q", failed.Load())
	}
	if avg < 6 {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("B averaged %.2f on a mix that never queues, want at least 6 of the ceiling 8 (samples %v; moves %+v)", avg, bs, moves)
	}
	if s.LastMove.Why == "" || s.LastMove.To != s.MaxConcurrent {
		t.Fatalf("last move %+v with B %d, want the move to B saying why", s.LastMove, s.MaxConcurrent)
	}
}

// Under load the gate keeps its server connections: after a warm-up
// second, at most one dial per 10 s (here at most one in 3 s), with B = 16
// and 64 callers, and with B = 3 and 8, queueing for their permits.
func TestOnPostgreSQLUnderLoadTheGateKeepsItsSessions(t *testing.T) {
	for _, c := range []struct {
		b, callers int
	}{{16, 64}, {3, 8}} {
		t.Run(fmt.Sprintf("B=%d, %d callers", c.b, c.callers), func(t *testing.T) {
			ctx := pgTestCtx(t)
			g, db := estGate(t, bulkhead.Policy{MaxConcurrent: c.b, MaxQueue: 4 * c.b, QueueWait: 50 * time.Millisecond})
			var n estCounts
			var refused atomic.Int64
			const d = 100 * time.Millisecond
			stop := estCallers(t, c.callers, func(_, _ int) {
				start := time.Now()
				err := estExec(ctx, db, d, "SELECT pg_sleep(0.005)")
				switch {
				case errors.Is(err, bulkhead.ErrRejected):
					refused.Add(1)
				case n.add(err) && time.Since(start) >= d:
					n.past.Add(1)
				}
				if err != nil {
					time.Sleep(time.Millisecond) // a refused caller backs off a little
				}
			})
			time.Sleep(time.Second) // the warm-up
			warm := g.Stats()
			time.Sleep(3 * time.Second) // the span measured
			end := g.Stats()
			stop()
			dials := end.Dials - warm.Dials
			t.Logf("figures: %d dials in the 3 s after the first second (%d before), %d ran in them; in all: %v, %d refused (any cause); open %d, bad %d",
				dials, warm.Dials, end.Admitted-warm.Admitted, &n, refused.Load(), end.OpenConns, end.BadConns)
			if dials > 1 {
				t.Fatalf("%d dials in 3 s after the first second (%d ran), want at most 1", dials, end.Admitted-warm.Admitted)
			}
			if n.other.Load() != 0 || end.Admitted-warm.Admitted < 100 {
				t.Fatalf("%v; want nothing failed but rejections and deadlines, and at least 100 run in the span", &n)
			}
		})
	}
}
