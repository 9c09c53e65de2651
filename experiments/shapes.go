package main

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
)

// The shapes of the overload experiment's requests (--shape): each a kind
// of work a service sends its database. All but cpu run on PostgreSQL
// alone, on tables named bulkhead_shape_* that the experiment creates.

const (
	shapeCPU        = "cpu"
	shapeSleep      = "sleep"
	shapeMix        = "mix"
	shapeOutlier    = "outlier"
	shapeLock       = "lock"
	shapeHotRow     = "hotrow"
	shapeRoundTrips = "roundtrips"
)

var overloadShapes = []string{shapeCPU, shapeSleep, shapeMix, shapeOutlier, shapeLock, shapeHotRow, shapeRoundTrips}

// The shapes' constants.
const (
	mixSlowShare    = 0.1 // of mix's requests, the slow ones
	mixSlowFactor   = 30  // their work, in fast ones
	outlierFactor   = 1000
	hotRowCPUShare  = 4   // hotrow's CPU work is cpu's divided by it
	rtRows          = 100 // rows of each roundtrips table
	maxSweep        = 8   // values of --sweep
	maxOutlierSleep = time.Minute
)

type opFunc = func(context.Context, *sql.DB) error

// request is what one arrival runs: op, which counts as good if it commits
// within deadline; kind indexes its shape's kinds.
type request struct {
	op       opFunc
	deadline time.Duration
	kind     int
}

// shape is the requests of one --shape for one run.
type shape struct {
	name  string
	work  string   // what a request does, for people
	kinds []string // the kinds of request by index; with one, no by-kind figures
	// draw returns a request of the shape's mix from rng; the outlier is
	// not drawn but scheduled (plan).
	draw func(rng *rand.Rand) request
	// The outlier shape's: one request like outlier per every of
	// arrivals.
	outlier *request
	every   time.Duration
}

// unit is what the shapes' work is measured in: rows of the CPU-bound
// query, and a service time for the shapes that sleep.
type unit struct {
	rows int
	s    time.Duration
}

// cpuQuery is the CPU-bound statement, as cli.Operation sends it on
// PostgreSQL.
func cpuQuery(rows int) string {
	return fmt.Sprintf("SELECT sum(i) FROM generate_series(1, %d) i", rows)
}

// sleepQuery is a pg_sleep of d, the constant in the statement's text.
func sleepQuery(d time.Duration) string {
	return "SELECT pg_sleep(" + strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + ")"
}

// newShape returns shape name's requests on cfg's target for unit u;
// deadline is --deadline, the normal requests'.
func newShape(cfg *overloadConfig, name string, u unit) *shape {
	d := cfg.deadline
	one := func(op opFunc) func(*rand.Rand) request {
		return func(*rand.Rand) request { return request{op: op, deadline: d} }
	}
	sh := &shape{name: name, kinds: []string{name}}
	switch name {
	case shapeCPU:
		sh.work = fmt.Sprintf("each request a transaction running a CPU-bound query over %d rows", u.rows)
		sh.draw = one(cli.Operation(cfg.target, "cpu", 0, u.rows))
	case shapeSleep:
		q := sleepQuery(u.s)
		sh.work = fmt.Sprintf("each request a transaction running %s (I/O-bound)", q)
		sh.draw = one(txOp(false, execStep(q)))
	case shapeMix:
		fast, slow := txOp(false, scanStep(cpuQuery(u.rows))), txOp(false, scanStep(fmt.Sprintf("SELECT sum(i) AS report FROM generate_series(1, %d) i", mixSlowFactor*u.rows)))
		sh.work = fmt.Sprintf("each request a transaction running a CPU-bound query over %d rows, or (%.0f%%) a report query over %d rows with %d× the deadline",
			u.rows, 100*mixSlowShare, mixSlowFactor*u.rows, mixSlowFactor)
		sh.kinds = []string{"fast", "slow"}
		sh.draw = func(rng *rand.Rand) request {
			if rng.Float64() < mixSlowShare {
				return request{op: slow, deadline: mixSlowFactor * d, kind: 1}
			}
			return request{op: fast, deadline: d}
		}
	case shapeOutlier:
		sleep := min(outlierFactor*u.s, cfg.outlierMax)
		q := sleepQuery(sleep)
		sh.work = fmt.Sprintf("each request a transaction running a CPU-bound query over %d rows, and once per %v of arrivals one running %s with the deadline %v",
			u.rows, cfg.outlierEvery, q, sleep+d)
		sh.kinds = []string{"normal", "outlier"}
		sh.draw = one(cli.Operation(cfg.target, "cpu", 0, u.rows))
		sh.outlier = &request{op: txOp(false, execStep(q)), deadline: sleep + d, kind: 1}
		sh.every = cfg.outlierEvery
	case shapeLock:
		q := fmt.Sprintf("SELECT sum(i) + (SELECT count(*) FROM bulkhead_shape_lock) FROM generate_series(1, %d) i", u.rows)
		sh.work = fmt.Sprintf("each request a transaction running a CPU-bound query over %d rows reading bulkhead_shape_lock, held in ACCESS EXCLUSIVE mode for %v from %v into the counted time",
			u.rows, cfg.lockHold, lockAt(cfg.duration))
		sh.draw = one(txOp(false, scanStep(q)))
	case shapeHotRow:
		rows := max(1, u.rows/hotRowCPUShare)
		sh.work = fmt.Sprintf("each request a transaction updating one hot row, then running a CPU-bound query over %d rows", rows)
		sh.draw = one(txOp(false, execStep("UPDATE bulkhead_shape_hot SET n = n + 1 WHERE id = 1"), scanStep(cpuQuery(rows))))
	case shapeRoundTrips:
		sh.work = "each request one of 5 kinds of transaction of 6 to 22 primary-key SELECTs and UPDATEs (read-only kinds shorter), about 15 round trips"
		sh.kinds = make([]string, len(rtKinds))
		for i, k := range rtKinds {
			sh.kinds[i] = k.name()
		}
		sh.draw = func(rng *rand.Rand) request {
			k := rng.IntN(len(rtKinds))
			return request{op: rtKinds[k].op(rng), deadline: d, kind: k}
		}
	default:
		panic("bug: unknown shape " + name)
	}
	return sh
}

// plan returns the request of each arrival of starts, drawn from a
// generator seeded with seed: the same for every configuration. The
// outlier shape puts its outlier on the first arrival at or after an
// offset drawn in each window of every, if one falls in the window.
func (sh *shape) plan(starts []time.Duration, seed uint64) []request {
	rng := rand.New(rand.NewPCG(seed, 0xda942042e4dd58b5))
	out := make([]request, len(starts))
	for i := range out {
		out[i] = sh.draw(rng)
	}
	if sh.outlier == nil || len(starts) == 0 {
		return out
	}
	orng := rand.New(rand.NewPCG(seed, 0x2545f4914f6cdd1d))
	for w := time.Duration(0); w <= starts[len(starts)-1]; w += sh.every {
		off := w + time.Duration(orng.Float64()*float64(sh.every))
		if i, _ := slices.BinarySearch(starts, off); i < len(starts) && starts[i] < w+sh.every {
			out[i] = *sh.outlier
		}
	}
	return out
}

// measureOp is an operation for closedLoop that runs, each time, a
// request of the shape's mix (no outlier), drawn from a generator seeded
// with seed.
func (sh *shape) measureOp(seed uint64) opFunc {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 0x14057b7ef767814f))
	return func(ctx context.Context, db *sql.DB) error {
		mu.Lock()
		r := sh.draw(rng)
		mu.Unlock()
		return r.op(ctx, db)
	}
}

// txStep is one statement of a transaction.
type txStep = func(ctx context.Context, tx *sql.Tx) error

// txOp returns an operation that runs steps in one transaction (read-only
// if asked) and commits; on an error it rolls back.
func txOp(readOnly bool, steps ...txStep) opFunc {
	var opts *sql.TxOptions
	if readOnly {
		opts = &sql.TxOptions{ReadOnly: true}
	}
	return func(ctx context.Context, db *sql.DB) error {
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return err
		}
		for _, s := range steps {
			if err := s(ctx, tx); err != nil {
				tx.Rollback()
				return err
			}
		}
		return tx.Commit()
	}
}

// scanStep is a statement whose one row is read.
func scanStep(query string, args ...any) txStep {
	return func(ctx context.Context, tx *sql.Tx) error {
		var v sql.NullString
		return tx.QueryRowContext(ctx, query, args...).Scan(&v)
	}
}

// execStep is a statement that returns no row.
func execStep(query string, args ...any) txStep {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, query, args...)
		return err
	}
}

// rtKind is a kind of the roundtrips shape's transactions: reads
// primary-key SELECTs on bulkhead_shape_rt_a, then writes UPDATEs of
// bulkhead_shape_rt_b, its rows in ascending order so that two
// transactions never wait for each other in a cycle.
type rtKind struct{ reads, writes int }

var rtKinds = []rtKind{{6, 0}, {10, 0}, {8, 4}, {10, 6}, {12, 10}}

func (k rtKind) name() string {
	if k.writes == 0 {
		return fmt.Sprintf("read%d", k.reads)
	}
	return fmt.Sprintf("read%d-write%d", k.reads, k.writes)
}

// op draws the rows of one transaction of kind k from rng.
func (k rtKind) op(rng *rand.Rand) opFunc {
	steps := make([]txStep, 0, k.reads+k.writes)
	for range k.reads {
		steps = append(steps, scanStep("SELECT n FROM bulkhead_shape_rt_a WHERE id = $1", 1+rng.IntN(rtRows)))
	}
	ids := rng.Perm(rtRows)[:k.writes]
	slices.Sort(ids)
	for _, id := range ids {
		steps = append(steps, execStep("UPDATE bulkhead_shape_rt_b SET n = n + 1 WHERE id = $1", 1+id))
	}
	return txOp(k.writes == 0, steps...)
}

// shapeTables are the statements that create a shape's tables, if
// missing, with their rows.
var shapeTables = map[string][]string{
	shapeLock: {
		"CREATE TABLE IF NOT EXISTS bulkhead_shape_lock (id int PRIMARY KEY)",
		"INSERT INTO bulkhead_shape_lock VALUES (1) ON CONFLICT DO NOTHING",
	},
	shapeHotRow: {
		"CREATE TABLE IF NOT EXISTS bulkhead_shape_hot (id int PRIMARY KEY, n bigint NOT NULL)",
		"INSERT INTO bulkhead_shape_hot VALUES (1, 0) ON CONFLICT DO NOTHING",
	},
	shapeRoundTrips: {
		"CREATE TABLE IF NOT EXISTS bulkhead_shape_rt_a (id int PRIMARY KEY, n bigint NOT NULL)",
		fmt.Sprintf("INSERT INTO bulkhead_shape_rt_a SELECT i, 0 FROM generate_series(1, %d) i ON CONFLICT DO NOTHING", rtRows),
		"CREATE TABLE IF NOT EXISTS bulkhead_shape_rt_b (id int PRIMARY KEY, n bigint NOT NULL)",
		fmt.Sprintf("INSERT INTO bulkhead_shape_rt_b SELECT i, 0 FROM generate_series(1, %d) i ON CONFLICT DO NOTHING", rtRows),
	},
}

// createShapeTables creates the tables shape name reads, if missing, in
// one transaction that holds an advisory lock, so that two runs at once
// do not both create them.
func createShapeTables(ctx context.Context, t *cli.Target, name string) error {
	stmts := shapeTables[name]
	if len(stmts) == 0 {
		return nil
	}
	db := sql.OpenDB(t.PlainConnector("bulkhead-setup"))
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 4*cli.ConnectTimeout)
	defer cancel()
	steps := []txStep{execStep("SELECT pg_advisory_xact_lock(hashtext('bulkhead_shape'))")}
	for _, s := range stmts {
		steps = append(steps, execStep(s))
	}
	if err := txOp(false, steps...)(ctx, db); err != nil {
		return fmt.Errorf("creating the tables of --shape %s on %s: %w", name, t.Display, err)
	}
	return nil
}

// lockAt is the offset into the counted duration at which the lock shape's
// session takes its lock.
func lockAt(duration time.Duration) time.Duration { return duration / 4 }

// lockHolder is the lock shape's session, outside any pool or gate: it
// holds bulkhead_shape_lock in ACCESS EXCLUSIVE mode once per phase.
type lockHolder struct {
	db   *sql.DB
	conn *sql.Conn
	done chan struct{}
	// Written by the holding goroutine, read after done: offsets from the
	// phase's start; 0 when not reached.
	locked, released time.Duration
	err              error
}

// openLockHolder dials the lock session, with application_name app.
func openLockHolder(ctx context.Context, t *cli.Target, app string) (*lockHolder, error) {
	db := sql.OpenDB(t.PlainConnector(app))
	ctx, cancel := context.WithTimeout(ctx, t.StartTimeout())
	defer cancel()
	c, err := db.Conn(ctx)
	if err == nil {
		err = c.PingContext(ctx)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("the lock session on %s: %w", t.Display, err)
	}
	return &lockHolder{db: db, conn: c, done: make(chan struct{})}, nil
}

// start takes the lock at begin+at and releases it hold after it was
// granted, on a goroutine of its own; ctx ending cuts the wait and the
// hold short. wait returns once it released the lock.
func (l *lockHolder) start(ctx context.Context, begin time.Time, at, hold time.Duration) {
	go func() {
		defer close(l.done)
		if !sleepCtx(ctx, time.Until(begin.Add(at))) {
			return
		}
		// The transaction outlives an interrupt: it ends with COMMIT.
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), hold+4*cli.ConnectTimeout)
		defer cancel()
		tx, err := l.conn.BeginTx(tctx, nil)
		if err != nil {
			l.err = err
			return
		}
		if _, err := tx.ExecContext(tctx, "LOCK TABLE bulkhead_shape_lock IN ACCESS EXCLUSIVE MODE"); err != nil {
			tx.Rollback()
			l.err = err
			return
		}
		l.locked = time.Since(begin)
		sleepCtx(ctx, hold)
		l.err = tx.Commit()
		l.released = time.Since(begin)
	}()
}

func (l *lockHolder) wait() { <-l.done }

func (l *lockHolder) close() {
	l.conn.Close()
	l.db.Close()
}

// sleepCtx waits for d or until ctx ends, and reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// parseSweep parses --sweep: distinct B values, 1 to max, at most
// maxSweep of them, in ascending order.
func parseSweep(s string, maxB int) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		b, err := strconv.Atoi(f)
		switch {
		case err != nil || b < 1 || b > maxB:
			return nil, fmt.Errorf("%q is not a B; want integers from 1 to %d, such as 1,2,4,8,16", f, maxB)
		case slices.Contains(out, b):
			return nil, fmt.Errorf("%d is given twice", b)
		}
		out = append(out, b)
	}
	if len(out) > maxSweep {
		return nil, fmt.Errorf("%d values, want at most %d", len(out), maxSweep)
	}
	slices.Sort(out)
	return out, nil
}
