package bulkhead

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"
)

//go:generate go run ./internal/genwrap

// What the logical connections present to database/sql.
//
// database/sql keeps the logical connections of Gate.Connect in its pool.
// A logical connection binds a server connection (a session, pool.go) when
// an operation on it holds its permits, or when a Ping, a Prepare or Raw
// needs one, and gives it back when database/sql takes the logical
// connection back into its pool (IsValid) or closes it.
//
// Each logical connection implements the optional driver interfaces of
// the driver's connections (wrap_gen.go has one type per combination;
// they are learned from the first connection dialed), because
// database/sql changes behaviour on their presence: NamedValueChecker
// decides whether pgx arrays pass, Pinger whether Ping reaches the server.
// The exceptions:
//   - it always implements driver.SessionResetter and driver.Validator:
//     they tell the gate when database/sql hands the connection out and
//     takes it back. The driver's own ResetSession runs when a session
//     passes to a new checkout, its IsValid when the session is given back,
//     and a session whose transaction was rolled back after its context
//     ended is closed unless the driver has both, exactly database/sql's
//     rule for its own pool (keepConnOnRollback).
//   - it always implements ConnBeginTx and ConnPrepareContext, and
//     ExecerContext (QueryerContext) when the driver has ExecerContext or
//     Execer (QueryerContext or Queryer): the context forms database/sql
//     derives from the legacy ones. For a legacy driver they convert
//     arguments and check the context exactly as database/sql would.
//
// Concurrency: database/sql calls a driver.Conn, and its Tx, Stmt and
// Rows, under its driverConn mutex, one call at a time, also from its own
// goroutines (the rollback after a cancellation, closing rows). That
// makes the plain fields of conn, tx and rows safe, and each release of a
// permit happen once without an atomic flag. lost is atomic all the same
// (loading it costs nothing).
type conn struct {
	g    *Gate
	sess *session // the bound server connection, or nil
	tx   tx       // the open transaction: a connection has at most one
	rows rows     // the rows of an autocommit query, reused while free
	exec permit   // the permits of the autocommit Exec running on it
	// lost: its session was lost to a panic in the driver. Every later
	// call returns driver.ErrBadConn, so database/sql discards it.
	lost atomic.Bool
}

var (
	_ driver.Conn               = (*conn)(nil)
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
	_ driver.Validator          = (*conn)(nil)
)

func newConn(g *Gate, mask uint) driver.Conn {
	c := &conn{g: g}
	c.tx.c = c
	c.rows.c = c
	return wrapConn(c, mask)
}

// bind gives c a session if it has none: the first idle one in the order
// they were opened (pool.get), waiting at most wait for one when all
// MaxConns are in use. Not the one c had last: under overload the logical
// connections that waited are many, and each preferring its own session
// spread the B running operations over all B+Q sessions; their backends
// then ran cold, and the gate's goodput with 10 ms transactions fell to
// 0.71–0.79 of a wait-before-checkout bulkhead's (issue 13). Taking the
// first idle one keeps the work on the fewest, warmest backends.
func (c *conn) bind(ctx context.Context, wait time.Duration) (*session, error) {
	if c.sess != nil {
		return c.sess, nil
	}
	p := c.g.pool
	s := p.takeFirst()
	if s == nil || !p.ready(ctx, s) {
		var err error
		if s, err = p.get(ctx, wait, c.g.lim.dryRun.Load()); err != nil {
			return nil, err
		}
	}
	s.used = true
	c.sess = s
	return s, nil
}

// unbind gives c's session back to the pool.
func (c *conn) unbind() {
	if s := c.sess; s != nil {
		c.sess = nil
		c.g.pool.put(s)
	}
}

// start takes the permits of an operation of kind k, then a session if c
// has none. On success the operation is counted as admitted and must end
// with c.g.release(p); on failure nothing is held.
//
// An operation that waits for its execution permit waits inside start,
// on a goroutine whose stack is most of what a waiting operation costs:
// start and its callers keep small frames (Gate.acquire unfolded, no
// closures or defers before the wait), so that the stack of a waiting
// operation stays within 4 KiB (BenchmarkWaitingOperation; one frame more
// once made it grow to 8 KiB).
func (c *conn) start(ctx context.Context, k Kind, p *permit) error {
	if !c.g.acquireNow(ctx, k, p) {
		if err := c.g.acquireSlow(ctx, k, p); err != nil {
			return err
		}
	}
	if c.sess == nil {
		if err := c.bindFor(ctx, p); err != nil {
			return err
		}
	}
	if c.sess.untagged {
		if err := c.tagFor(ctx, p); err != nil {
			return err
		}
	}
	c.g.admitted(p)
	return nil
}

// bindFor binds a session to c for an operation holding p. On failure,
// or a panic in the driver's ResetSession, it gives p's permits back.
func (c *conn) bindFor(ctx context.Context, p *permit) error {
	bound := false
	defer func() {
		if !bound { // a panic in the driver's ResetSession
			c.g.abort(p, errPanicked)
		}
	}()
	wait := c.g.connWait()
	_, err := c.bind(ctx, wait)
	bound = true
	if err != nil {
		err = c.g.connErr(err, wait)
		c.g.abort(p, err)
		return err
	}
	return nil
}

// tagFor runs a fleet's tag (fleet.tag) on c's session before the first
// operation on it, for an operation holding p: within that operation's
// permits, so that the tag's statement is part of the work the budget
// counts. A session the tag fails or panics on is closed, and p's permits
// given back.
func (c *conn) tagFor(ctx context.Context, p *permit) error {
	s := c.sess
	done := false
	defer func() {
		if !done { // a panic in the driver
			c.sess = nil
			c.g.pool.closeSession(s)
			c.g.abort(p, errPanicked)
		}
	}()
	err := c.g.pool.tag(ctx, s.ci)
	done = true
	if err != nil {
		c.sess = nil
		c.g.pool.closeSession(s)
		c.g.abort(p, err)
		return err
	}
	s.untagged = false
	return nil
}

var errPanicked = errors.New("bulkhead: the driver panicked")

// Unwrap returns the driver's own connection, binding a server connection
// to c if it has none (for (*sql.Conn).Raw; see the package function
// Unwrap). It returns nil if no server connection could be had: all
// MaxConns in use for longer than WithConnWait, or the dial failed.
func (c *conn) Unwrap() driver.Conn {
	if c.lost.Load() {
		return nil
	}
	s, err := c.bind(context.Background(), c.g.connWait())
	if err != nil {
		return nil
	}
	return s.ci
}

// Unwrap returns the driver's own connection behind dc, the value that
// (*sql.Conn).Raw passes to its function, peeling every layer that has an
// Unwrap() driver.Conn method. A value that is not a wrapper is returned
// as it is. Behind a gate, the *sql.Conn keeps that server connection
// until it is closed; Unwrap returns nil if the gate could not get one
// (all MaxConns in use for longer than WithConnWait, or the dial
// failed).
//
//	err := sqlConn.Raw(func(dc any) error {
//		pgxConn := bulkhead.Unwrap(dc).(*stdlib.Conn).Conn()
//		...
//	})
func Unwrap(dc any) any {
	for {
		u, ok := dc.(interface{ Unwrap() driver.Conn })
		if !ok {
			return dc
		}
		inner := u.Unwrap()
		if inner == nil {
			return nil
		}
		dc = inner
	}
}

// ResetSession is called by database/sql when it hands c out of its pool.
// c holds no session then; the session it binds later is reset by the
// driver at that moment, after the operation's permits: a rejection sends
// nothing to the server.
func (c *conn) ResetSession(context.Context) error {
	if c.lost.Load() {
		return driver.ErrBadConn
	}
	return nil
}

// IsValid is called by database/sql when it takes c back into its pool:
// c gives its session back.
func (c *conn) IsValid() bool {
	if c.lost.Load() {
		return false
	}
	c.unbind()
	return true
}

// Close closes the logical connection. A session still bound is closed
// too: database/sql closes a connection it has not taken back into its
// pool only when it found it bad. A transaction still open on it (its
// Commit or Rollback never returned) gives its permits back.
func (c *conn) Close() error {
	defer c.tx.end()
	if s := c.sess; s != nil {
		c.sess = nil
		c.g.pool.closeDead(s)
	}
	return nil
}

// guarded runs f, a call into the driver on c's session. If the driver
// panics instead of returning, the session is lost: database/sql never
// closes a connection whose driver call panicked (it even reuses it after
// a panic in an autocommit Exec), so the gate closes the session, frees
// its place under MaxConns, ends a transaction open on it, and marks c
// lost: later calls on it return driver.ErrBadConn, which makes
// database/sql discard it. The panic goes on up.
func guarded[T any](c *conn, f func() (T, error)) (T, error) {
	returned := false
	defer c.lostUnless(&returned)
	v, err := f()
	returned = true
	return v, err
}

func (c *conn) lostUnless(returned *bool) {
	if !*returned && c.lost.CompareAndSwap(false, true) {
		defer c.tx.end() // a transaction open on a lost session runs no more
		if s := c.sess; s != nil {
			c.sess = nil
			c.g.pool.closeSession(s)
		}
	}
}

// Prepare is the legacy form of PrepareContext.
func (c *conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// PrepareContext prepares without a permit: preparing runs no user work.
// A query prepared before, on a connection with no server connection,
// is prepared on the server only when it runs (see stmt); otherwise it
// needs a server connection, which c keeps until database/sql takes it
// back. The statement's executions outside a transaction are gated.
func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if c.lost.Load() {
		return nil, driver.ErrBadConn
	}
	if c.sess == nil {
		if pr := c.g.stmtProtoFor(query); pr != nil {
			return wrapStmt(&stmt{c: c, query: query, proto: pr}, pr.mask), nil
		}
	}
	wait := c.g.connWait()
	s, err := c.bind(ctx, wait)
	if err != nil {
		return nil, c.g.connErr(err, wait)
	}
	numInput := 0
	si, err := guarded(c, func() (driver.Stmt, error) {
		si, err := s.prepare(ctx, query)
		if err == nil {
			// Asked now, while c holds s: a driver may work it out on its
			// connection (ncruces/go-sqlite3 does, lazily), and other
			// connections will ask the gate for it concurrently.
			numInput = si.NumInput()
		}
		return si, err
	})
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	pr := c.g.addStmtProto(query, si, numInput)
	st := &stmt{c: c, query: query, proto: pr}
	st.keep(s, si)
	return wrapStmt(st, pr.mask), nil
}

// prepare prepares query on s, as database/sql would on s alone.
func (s *session) prepare(ctx context.Context, query string) (driver.Stmt, error) {
	if s.preparer != nil {
		return s.preparer.PrepareContext(ctx, query)
	}
	si, err := s.ci.Prepare(query)
	if err == nil && ctx.Err() != nil {
		si.Close()
		return nil, ctx.Err()
	}
	return si, err
}

// Begin is the legacy form of BeginTx.
func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx acquires both permits and a session, then begins the
// transaction. The permits are held until the driver's Commit or Rollback
// returns.
func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if c.lost.Load() {
		return nil, driver.ErrBadConn
	}
	if c.tx.held {
		return nil, ErrTxStillOpen
	}
	// The permits are taken in place: c.tx holds them once it is held.
	p := &c.tx.p
	if err := c.start(ctx, KindTx, p); err != nil {
		return nil, err
	}
	began := false
	defer func() {
		if !began {
			c.g.release(p)
		}
	}()
	s := c.sess
	ti, err := guarded(c, func() (driver.Tx, error) { return s.begin(ctx, opts) })
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	if dl := c.g.opt.pgDL; dl != nil {
		if err := c.setServerDeadline(ctx, dl); err != nil {
			ti.Rollback()
			return nil, err
		}
	}
	c.tx.inner, c.tx.ctx = ti, ctx
	c.tx.held = true
	began = true
	return &c.tx, nil
}

func (s *session) begin(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if s.beginner != nil {
		return s.beginner.BeginTx(ctx, opts)
	}
	// As database/sql does for a driver without ConnBeginTx.
	if opts.Isolation != 0 {
		return nil, errors.New("bulkhead: driver does not support non-default isolation level")
	}
	if opts.ReadOnly {
		return nil, errors.New("bulkhead: driver does not support read-only transactions")
	}
	ti, err := s.ci.Begin() //lint:ignore SA1019 the legacy driver has nothing else
	if err == nil && ctx.Err() != nil {
		ti.Rollback()
		return nil, ctx.Err()
	}
	return ti, err
}

// pgMaxTimeout is PostgreSQL's largest statement_timeout and lock_timeout,
// in milliseconds (a 32-bit int).
const pgMaxTimeout = math.MaxInt32

// setServerDeadline starts the transaction with PostgreSQL timeouts set
// from ctx's deadline (WithPostgresDeadline).
func (c *conn) setServerDeadline(ctx context.Context, dl *PostgresDeadline) error {
	d, ok := ctx.Deadline()
	if !ok {
		return nil
	}
	ms := strconv.FormatInt(min(max((time.Until(d)-dl.Reserve).Milliseconds(), 1), pgMaxTimeout), 10)
	q := "SET LOCAL statement_timeout = " + ms
	if dl.LockTimeout {
		q += "; SET LOCAL lock_timeout = " + ms
	}
	if _, err := c.execSkipping(ctx, q, nil); err != nil {
		return fmt.Errorf("bulkhead: setting the server-side deadline: %w", ctxErr(ctx, err))
	}
	return nil
}

// inTx is called for a statement on c while c has an open transaction:
// the statement belongs to it and takes no permit. It returns an error if
// that transaction is dying: its context ended and database/sql has not
// rolled it back yet, so the statement would run inside a transaction
// about to vanish. A statement whose own context ended gets that
// context's error.
func (c *conn) inTx(ctx context.Context) error {
	if c.tx.ctx.Err() != nil {
		if err := ctx.Err(); err != nil {
			return err
		}
		return ErrTxStillOpen
	}
	return nil
}

// execContext runs an autocommit statement under both permits, or a
// statement of the open transaction without taking any.
func (c *conn) execContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.lost.Load() {
		return nil, driver.ErrBadConn
	}
	if c.tx.held {
		return c.execInTx(ctx, query, args)
	}
	if err := c.start(ctx, KindExec, &c.exec); err != nil {
		return nil, err
	}
	defer c.g.release(&c.exec)
	r, err := c.execSkipping(ctx, query, args)
	return r, ctxErr(ctx, err)
}

// execInTx runs a statement of c's open transaction.
func (c *conn) execInTx(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if err := c.inTx(ctx); err != nil {
		return nil, err
	}
	r, err := c.execInner(ctx, query, args)
	return r, ctxErr(ctx, err)
}

// execSkipping runs query on c's session. If the driver answers
// driver.ErrSkip (go-sql-driver/mysql does for every statement with
// arguments unless interpolateParams is set), it runs database/sql's
// fallback itself, preparing the statement and executing it, so that the
// permit already held covers the whole operation instead of the operation
// being admitted a second time.
func (c *conn) execSkipping(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	r, err := c.execInner(ctx, query, args)
	if err != driver.ErrSkip {
		return r, err
	}
	return c.execFallback(ctx, query, args)
}

// execFallback is database/sql's answer to driver.ErrSkip for an Exec:
// prepare, execute, close.
func (c *conn) execFallback(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	si, sargs, err := c.prepareFallback(ctx, query, args)
	if err != nil {
		return nil, err
	}
	defer c.closeFallback(si)
	return guarded(c, func() (driver.Result, error) { return stmtExec(ctx, si, sargs) })
}

// prepareFallback prepares query on c's session as database/sql does
// after a driver answered driver.ErrSkip, and converts args for the
// statement as database/sql converts the caller's arguments for it.
func (c *conn) prepareFallback(ctx context.Context, query string, args []driver.NamedValue) (driver.Stmt, []driver.NamedValue, error) {
	s := c.sess
	si, err := guarded(c, func() (driver.Stmt, error) { return s.prepare(ctx, query) })
	if err != nil {
		return nil, nil, err
	}
	sargs, err := stmtArgs(si, s.checker, args)
	if err != nil {
		c.closeFallback(si)
		return nil, nil, err
	}
	return si, sargs, nil
}

func (c *conn) closeFallback(si driver.Stmt) {
	guarded(c, func() (struct{}, error) { return struct{}{}, si.Close() })
}

func (c *conn) execInner(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	s := c.sess
	return guarded(c, func() (driver.Result, error) { return s.exec(ctx, query, args) })
}

func (s *session) exec(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if s.execer != nil {
		return s.execer.ExecContext(ctx, query, args)
	}
	if s.legacyExecer == nil {
		return nil, driver.ErrSkip // a driver whose connections differ: database/sql prepares instead
	}
	dargs, err := namedValueToValue(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.legacyExecer.Exec(query, dargs) //lint:ignore SA1019 the legacy driver has nothing else
}

// queryContext runs an autocommit query whose Rows hold both permits
// until they are closed, or a query of the open transaction without
// taking any (its rows are then the driver's own).
func (c *conn) queryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if c.lost.Load() {
		return nil, driver.ErrBadConn
	}
	if c.tx.held {
		return c.queryInTx(ctx, query, args)
	}
	r, err := c.startRows(ctx)
	if err != nil {
		return nil, err
	}
	return c.autocommitQuery(ctx, r, query, args)
}

// queryInTx runs a query of c's open transaction: its rows are the
// driver's own.
func (c *conn) queryInTx(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := c.inTx(ctx); err != nil {
		return nil, err
	}
	ri, err := c.queryInner(ctx, query, args)
	return ri, ctxErr(ctx, err)
}

// autocommitQuery runs query for r, which holds the permits.
func (c *conn) autocommitQuery(ctx context.Context, r *rows, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.runRows(ctx, r, func() (driver.Rows, driver.Stmt, error) {
		ri, err := c.queryInner(ctx, query, args)
		if err != driver.ErrSkip {
			return ri, nil, err
		}
		// As in execSkipping: database/sql's fallback, under the permit
		// held; the statement is closed with the rows.
		si, sargs, err := c.prepareFallback(ctx, query, args)
		if err != nil {
			return nil, nil, err
		}
		ri, err = guarded(c, func() (driver.Rows, error) { return stmtQuery(ctx, si, sargs) })
		if err != nil {
			c.closeFallback(si)
			return nil, nil, err
		}
		return ri, si, nil
	})
}

func (c *conn) queryInner(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	s := c.sess
	return guarded(c, func() (driver.Rows, error) { return s.query(ctx, query, args) })
}

func (s *session) query(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if s.queryer != nil {
		return s.queryer.QueryContext(ctx, query, args)
	}
	if s.legacyQueryer == nil {
		return nil, driver.ErrSkip // a driver whose connections differ: database/sql prepares instead
	}
	dargs, err := namedValueToValue(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.legacyQueryer.Query(query, dargs) //lint:ignore SA1019 the legacy driver has nothing else
}

// startRows takes both permits and a session for an autocommit query, in
// place in the rows that will hold them: c's own, or new ones if c's are
// still open (two result sets on one *sql.Conn). The caller runs the
// query with runRows.
func (c *conn) startRows(ctx context.Context) (*rows, error) {
	r := &c.rows
	if r.held {
		r = &rows{c: c}
	}
	if err := c.start(ctx, KindQuery, &r.p); err != nil {
		return nil, err
	}
	return r, nil
}

// runRows runs query for r, which holds the permits (startRows). They pass
// to the returned rows, released by their Close (which also closes the
// statement query may return, an ErrSkip fallback's); on an error or a
// panic they are released at once.
func (c *conn) runRows(ctx context.Context, r *rows, query func() (driver.Rows, driver.Stmt, error)) (driver.Rows, error) {
	handed := false
	defer func() {
		if !handed {
			c.g.release(&r.p)
		}
	}()
	ri, si, err := query()
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	r.inner, r.stmt = ri, si
	r.held = true
	handed = true
	return wrapRows(r, rowsMask(ri)), nil
}

// ping forwards the driver's Pinger: not gated (health checks must answer
// under overload), but it needs a server connection, which c keeps until
// database/sql takes it back. A driver whose connections differ (no
// Pinger on this one) answers nil, as database/sql does without a Pinger.
func (c *conn) ping(ctx context.Context) error {
	if c.lost.Load() {
		return driver.ErrBadConn
	}
	wait := c.g.connWait()
	s, err := c.bind(ctx, wait)
	if err != nil {
		return c.g.connErr(err, wait)
	}
	if s.pinger == nil {
		return nil
	}
	_, err = guarded(c, func() (struct{}, error) { return struct{}{}, s.pinger.Ping(ctx) })
	return ctxErr(ctx, err)
}

// checkNamedValue forwards the driver's NamedValueChecker. database/sql
// calls it before the operation, when c may have no session yet: then the
// checker of the first connection dialed converts the value, which is
// right for drivers whose conversion depends on the value alone (pgx and
// go-sql-driver/mysql: every checker they have).
func (c *conn) checkNamedValue(v *driver.NamedValue) error {
	if s := c.sess; s != nil && s.checker != nil {
		return s.checker.CheckNamedValue(v)
	}
	if pi := c.g.pool.proto.Load(); pi != nil && pi.checker != nil {
		return pi.checker.CheckNamedValue(v)
	}
	return driver.ErrSkip
}

func namedValueToValue(named []driver.NamedValue) ([]driver.Value, error) {
	args := make([]driver.Value, len(named))
	for i, nv := range named {
		if nv.Name != "" {
			return nil, errors.New("bulkhead: driver does not support the use of named parameters")
		}
		args[i] = nv.Value
	}
	return args, nil
}

func valueToNamedValue(args []driver.Value) []driver.NamedValue {
	named := make([]driver.NamedValue, len(args))
	for i, v := range args {
		named[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return named
}
