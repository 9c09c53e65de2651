package bulkhead

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"
)

//go:generate go run ./internal/genwrap

// What the wrappers present to database/sql.
//
// Each wrapped Conn, Stmt and Rows implements exactly the optional driver
// interfaces its inner value implements (wrap_gen.go has one type per
// combination), because database/sql changes behaviour on their presence:
// Validator and SessionResetter decide whether a connection survives a
// rolled-back transaction, NamedValueChecker whether pgx arrays pass,
// RowsColumnType* what ColumnTypes reports.
//
// The exceptions are the context forms that database/sql itself derives from
// the legacy ones: a wrapped Conn always implements ConnBeginTx and
// ConnPrepareContext, it implements ExecerContext (QueryerContext) when the
// inner conn has ExecerContext or Execer (QueryerContext or Queryer), and a
// wrapped Stmt always implements StmtExecContext and StmtQueryContext. For a
// legacy inner value they convert arguments and check the context exactly
// as database/sql would, so nothing changes for the caller.

// ErrTxStillOpen is returned by BeginTx on a connection whose previous
// transaction has not ended in the driver yet. database/sql lets this
// happen on a *sql.Conn: after the transaction's context ended, Commit
// returns the context's error at once and the driver's rollback runs a
// moment later in database/sql's goroutine; a BeginTx on the same
// *sql.Conn in between reaches the driver while the old transaction is
// still open (plain pgx would then silently nest the two). It is not a
// rejection: try again, or take a fresh *sql.Conn.
var ErrTxStillOpen = errors.New("bulkhead: BeginTx on a connection whose previous transaction has not ended yet")

// conn is one physical connection of the gate. database/sql calls a
// driver.Conn under its driverConn mutex, one call at a time, also from its
// own goroutine (the rollback after a cancellation), and starts that
// goroutine only after BeginTx returned: that ordering is what makes the
// plain fields of tx (inner, p) safe. The flags a wrapper checks on every
// call (closed, tx.held) are atomic all the same.
type conn struct {
	g     *Gate
	inner driver.Conn
	tx    tx // the open transaction: a connection has at most one at a time

	// The inner conn's optional interfaces, asserted once: nil where it
	// lacks one (the generated wrapper then lacks it too, or falls back to
	// the legacy form as database/sql would).
	execer    driver.ExecerContext  // nil: use the legacy Execer
	queryer   driver.QueryerContext // nil: use the legacy Queryer
	beginner  driver.ConnBeginTx
	preparer  driver.ConnPrepareContext
	pinger    driver.Pinger
	resetter  driver.SessionResetter
	validator driver.Validator
	closed    atomic.Bool // closed, or lost to a panic in the driver
}

var (
	_ driver.Conn               = (*conn)(nil)
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
)

func newConn(g *Gate, ci driver.Conn) driver.Conn {
	c := &conn{g: g, inner: ci}
	c.tx.c = c
	c.execer, _ = ci.(driver.ExecerContext)
	c.queryer, _ = ci.(driver.QueryerContext)
	c.beginner, _ = ci.(driver.ConnBeginTx)
	c.preparer, _ = ci.(driver.ConnPrepareContext)
	c.pinger, _ = ci.(driver.Pinger)
	c.resetter, _ = ci.(driver.SessionResetter)
	c.validator, _ = ci.(driver.Validator)
	mask := connMask(ci)
	if _, ok := ci.(driver.Execer); ok {
		mask |= 1 << 0
	}
	if _, ok := ci.(driver.Queryer); ok {
		mask |= 1 << 1
	}
	return wrapConn(c, mask)
}

// Unwrap returns the driver's own connection. (*sql.Conn).Raw hands its
// function the wrapper; see the package function Unwrap.
func (c *conn) Unwrap() driver.Conn { return c.inner }

// Unwrap returns the driver's own connection behind dc, the value that
// (*sql.Conn).Raw passes to its function, peeling every layer that has an
// Unwrap() driver.Conn method. A value that is not a wrapper is returned
// as it is.
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
		dc = u.Unwrap()
	}
}

// Prepare is the legacy form of PrepareContext.
func (c *conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// PrepareContext prepares without a permit: preparing runs no user work.
// The statement's executions outside a transaction are gated.
func (c *conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if c.closed.Load() {
		return nil, driver.ErrBadConn
	}
	si, err := guarded(c, func() (driver.Stmt, error) { return c.prepareInner(ctx, query) })
	if err != nil {
		return nil, err
	}
	return wrapStmt(&stmt{c: c, inner: si}, stmtMask(si)), nil
}

func (c *conn) prepareInner(ctx context.Context, query string) (driver.Stmt, error) {
	if c.preparer != nil {
		return c.preparer.PrepareContext(ctx, query)
	}
	si, err := c.inner.Prepare(query)
	if err == nil && ctx.Err() != nil {
		si.Close()
		return nil, ctx.Err()
	}
	return si, err
}

// Close closes the connection. A transaction still open on it (its
// Commit or Rollback never returned) gives its permits back here.
func (c *conn) Close() error {
	defer c.tx.end()
	if !c.closed.CompareAndSwap(false, true) {
		return nil // lost to a panic: closed already
	}
	defer c.g.connClosed()
	return c.inner.Close()
}

// guarded runs f, a call into the driver. If the driver panics instead of
// returning, the connection is lost: database/sql never closes a
// connection whose driver call panicked (it even reuses it after a panic
// in an autocommit Exec), so the gate closes the driver's connection and
// stops counting it against B+Q, and later calls on it return
// driver.ErrBadConn, which makes database/sql discard it. The panic goes
// on up.
func guarded[T any](c *conn, f func() (T, error)) (T, error) {
	returned := false
	defer c.lostUnless(&returned)
	v, err := f()
	returned = true
	return v, err
}

func (c *conn) lostUnless(returned *bool) {
	if !*returned && c.closed.CompareAndSwap(false, true) {
		defer c.g.connClosed()
		defer c.tx.end() // a transaction open on a lost connection runs no more
		c.inner.Close()
	}
}

// Begin is the legacy form of BeginTx.
func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx acquires both permits, then begins the transaction. The permits
// are held until the driver's Commit or Rollback returns.
func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if c.closed.Load() {
		return nil, driver.ErrBadConn
	}
	if c.tx.held.Load() {
		return nil, ErrTxStillOpen
	}
	var p permit
	if err := c.g.acquire(ctx, KindTx, &p); err != nil {
		return nil, err
	}
	began := false
	defer func() {
		if !began {
			c.g.release(&p)
		}
	}()
	ti, err := guarded(c, func() (driver.Tx, error) { return c.beginInner(ctx, opts) })
	if err != nil {
		return nil, err
	}
	if dl := c.g.opt.pgDL; dl != nil {
		if err := c.setServerDeadline(ctx, dl); err != nil {
			ti.Rollback()
			return nil, err
		}
	}
	c.tx.inner = ti
	c.tx.p = p
	c.tx.held.Store(true)
	began = true
	return &c.tx, nil
}

func (c *conn) beginInner(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if c.beginner != nil {
		return c.beginner.BeginTx(ctx, opts)
	}
	// As database/sql does for a driver without ConnBeginTx.
	if opts.Isolation != 0 {
		return nil, errors.New("bulkhead: driver does not support non-default isolation level")
	}
	if opts.ReadOnly {
		return nil, errors.New("bulkhead: driver does not support read-only transactions")
	}
	ti, err := c.inner.Begin() // the legacy driver has nothing else
	if err == nil && ctx.Err() != nil {
		ti.Rollback()
		return nil, ctx.Err()
	}
	return ti, err
}

// setServerDeadline starts the transaction with PostgreSQL timeouts set
// from ctx's deadline (WithPostgresDeadline).
func (c *conn) setServerDeadline(ctx context.Context, dl *PostgresDeadline) error {
	d, ok := ctx.Deadline()
	if !ok {
		return nil
	}
	ms := strconv.FormatInt(max((time.Until(d)-dl.Reserve).Milliseconds(), 1), 10)
	q := "SET LOCAL statement_timeout = " + ms
	if dl.LockTimeout {
		q += "; SET LOCAL lock_timeout = " + ms
	}
	if _, err := c.execSkipping(ctx, q, nil); err != nil {
		return fmt.Errorf("bulkhead: setting the server-side deadline: %w", err)
	}
	return nil
}

// execContext runs an autocommit statement under both permits, or a
// statement of the open transaction without taking any.
func (c *conn) execContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.closed.Load() {
		return nil, driver.ErrBadConn
	}
	if c.tx.held.Load() {
		return c.execInner(ctx, query, args)
	}
	var p permit
	if err := c.g.acquire(ctx, KindExec, &p); err != nil {
		return nil, err
	}
	defer c.g.release(&p)
	return c.execSkipping(ctx, query, args)
}

// execSkipping runs query on the inner connection. If the driver answers
// driver.ErrSkip (go-sql-driver/mysql does for every statement with
// arguments unless interpolateParams is set), it runs database/sql's
// fallback itself, preparing the statement and executing it, so that the
// permit already held covers the whole operation instead of the operation
// being admitted a second time.
func (c *conn) execSkipping(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	r, err := c.execInner(ctx, query, args)
	if err == nil || !errors.Is(err, driver.ErrSkip) {
		return r, err
	}
	s, err := c.prepareFallback(ctx, query, len(args))
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.execInner(ctx, args)
}

// prepareFallback prepares query on the inner connection as database/sql
// does after a driver answered driver.ErrSkip, checking the argument
// count as it does.
func (c *conn) prepareFallback(ctx context.Context, query string, nargs int) (*stmt, error) {
	si, err := c.prepareInner(ctx, query)
	if err != nil {
		return nil, err
	}
	if want := si.NumInput(); want >= 0 && want != nargs {
		si.Close()
		return nil, fmt.Errorf("bulkhead: expected %d arguments, got %d", want, nargs)
	}
	return &stmt{c: c, inner: si}, nil
}

func (c *conn) execInner(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return guarded(c, func() (driver.Result, error) { return c.execDriver(ctx, query, args) })
}

func (c *conn) execDriver(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if c.execer != nil {
		return c.execer.ExecContext(ctx, query, args)
	}
	dargs, err := namedValueToValue(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.inner.(driver.Execer).Exec(query, dargs) // the legacy driver has nothing else
}

// queryContext runs an autocommit query whose Rows hold both permits
// until they are closed, or a query of the open transaction without
// taking any (its rows are then the driver's own).
func (c *conn) queryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if c.closed.Load() {
		return nil, driver.ErrBadConn
	}
	if c.tx.held.Load() {
		return c.queryInner(ctx, query, args)
	}
	return c.g.holdRows(ctx, c, func() (driver.Rows, driver.Stmt, error) {
		ri, err := c.queryInner(ctx, query, args)
		if err == nil || !errors.Is(err, driver.ErrSkip) {
			return ri, nil, err
		}
		// As in execContext: database/sql's fallback, under the permit
		// held; the statement is closed with the rows.
		s, err := c.prepareFallback(ctx, query, len(args))
		if err != nil {
			return nil, nil, err
		}
		ri, err = s.queryInner(ctx, args)
		if err != nil {
			s.Close()
			return nil, nil, err
		}
		return ri, s.inner, nil
	})
}

func (c *conn) queryInner(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return guarded(c, func() (driver.Rows, error) { return c.queryDriver(ctx, query, args) })
}

func (c *conn) queryDriver(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if c.queryer != nil {
		return c.queryer.QueryContext(ctx, query, args)
	}
	dargs, err := namedValueToValue(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.inner.(driver.Queryer).Query(query, dargs) // the legacy driver has nothing else
}

// holdRows acquires both permits and runs query. The permits pass to the
// returned rows, released by their Close (which also closes the statement
// query may return, an ErrSkip fallback's); on an error or a panic they
// are released at once.
func (g *Gate) holdRows(ctx context.Context, c *conn, query func() (driver.Rows, driver.Stmt, error)) (driver.Rows, error) {
	var p permit
	if err := g.acquire(ctx, KindQuery, &p); err != nil {
		return nil, err
	}
	handed := false
	defer func() {
		if !handed {
			g.release(&p)
		}
	}()
	ri, si, err := query()
	if err != nil {
		return nil, err
	}
	r := &rows{c: c, inner: ri, stmt: si, p: p}
	r.held.Store(true)
	handed = true
	return wrapRows(r, rowsMask(ri)), nil
}

// tx is the open transaction of a conn. It holds both permits from a
// successful BeginTx until the driver's Commit or Rollback returns, on
// whatever goroutine calls it (database/sql rolls back from its own
// goroutine when the transaction's context ends).
type tx struct {
	c     *conn
	inner driver.Tx
	p     permit
	held  atomic.Bool
}

var _ driver.Tx = (*tx)(nil)

func (t *tx) Commit() error {
	defer t.end()
	_, err := guarded(t.c, func() (struct{}, error) { return struct{}{}, t.inner.Commit() })
	return err
}

func (t *tx) Rollback() error {
	defer t.end()
	_, err := guarded(t.c, func() (struct{}, error) { return struct{}{}, t.inner.Rollback() })
	return err
}

// end releases the transaction's permits, once.
func (t *tx) end() {
	if t.held.CompareAndSwap(true, false) {
		t.c.g.release(&t.p)
	}
}

// stmt is a prepared statement. Its executions outside a transaction are
// gated like the conn's; inside one (a statement prepared on the
// transaction, or moved into it with Tx.Stmt) they take no permit.
type stmt struct {
	c     *conn
	inner driver.Stmt
}

var (
	_ driver.Stmt             = (*stmt)(nil)
	_ driver.StmtExecContext  = (*stmt)(nil)
	_ driver.StmtQueryContext = (*stmt)(nil)
)

func (s *stmt) Close() error  { return s.inner.Close() }
func (s *stmt) NumInput() int { return s.inner.NumInput() }

// Exec is the legacy form of ExecContext.
func (s *stmt) Exec(args []driver.Value) (driver.Result, error) {
	return s.ExecContext(context.Background(), valueToNamedValue(args))
}

// Query is the legacy form of QueryContext.
func (s *stmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.QueryContext(context.Background(), valueToNamedValue(args))
}

func (s *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if s.c.closed.Load() {
		return nil, driver.ErrBadConn
	}
	if s.c.tx.held.Load() {
		return s.execInner(ctx, args)
	}
	var p permit
	if err := s.c.g.acquire(ctx, KindExec, &p); err != nil {
		return nil, err
	}
	defer s.c.g.release(&p)
	return s.execInner(ctx, args)
}

func (s *stmt) execInner(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return guarded(s.c, func() (driver.Result, error) { return s.execDriver(ctx, args) })
}

func (s *stmt) execDriver(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	if e, ok := s.inner.(driver.StmtExecContext); ok {
		return e.ExecContext(ctx, args)
	}
	dargs, err := namedValueToValue(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.inner.Exec(dargs) // the legacy driver has nothing else
}

func (s *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if s.c.closed.Load() {
		return nil, driver.ErrBadConn
	}
	if s.c.tx.held.Load() {
		return s.queryInner(ctx, args)
	}
	return s.c.g.holdRows(ctx, s.c, func() (driver.Rows, driver.Stmt, error) {
		ri, err := s.queryInner(ctx, args)
		return ri, nil, err
	})
}

func (s *stmt) queryInner(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return guarded(s.c, func() (driver.Rows, error) { return s.queryDriver(ctx, args) })
}

func (s *stmt) queryDriver(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if q, ok := s.inner.(driver.StmtQueryContext); ok {
		return q.QueryContext(ctx, args)
	}
	dargs, err := namedValueToValue(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.inner.Query(dargs) // the legacy driver has nothing else
}

// rows holds an autocommit query's permits until Close returns.
// database/sql closes rows itself at the end of Next, in Row.Scan, and from
// its own goroutine when the query's context ends.
type rows struct {
	c     *conn
	inner driver.Rows
	stmt  driver.Stmt // the ErrSkip fallback's statement, closed after the rows; or nil
	p     permit
	held  atomic.Bool
}

var _ driver.Rows = (*rows)(nil)

func (r *rows) Columns() []string              { return r.inner.Columns() }
func (r *rows) Next(dest []driver.Value) error { return r.inner.Next(dest) }

func (r *rows) Close() error {
	defer func() {
		if r.held.CompareAndSwap(true, false) {
			r.c.g.release(&r.p)
		}
	}()
	_, err := guarded(r.c, func() (struct{}, error) { return struct{}{}, r.inner.Close() })
	if r.stmt != nil {
		if cerr := r.stmt.Close(); err == nil {
			err = cerr
		}
	}
	return err
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

// ping, resetSession and isValid forward the optional Pinger,
// SessionResetter and Validator under guarded: database/sql calls them
// outside any gated operation, and a panic there would leave the
// connection counted against B+Q while database/sql never returns it. A
// lost connection answers as a bad one.
func (c *conn) ping(ctx context.Context) error {
	if c.closed.Load() {
		return driver.ErrBadConn
	}
	_, err := guarded(c, func() (struct{}, error) { return struct{}{}, c.pinger.Ping(ctx) })
	return err
}

func (c *conn) resetSession(ctx context.Context) error {
	if c.closed.Load() {
		return driver.ErrBadConn
	}
	_, err := guarded(c, func() (struct{}, error) { return struct{}{}, c.resetter.ResetSession(ctx) })
	return err
}

func (c *conn) isValid() bool {
	if c.closed.Load() {
		return false
	}
	ok, _ := guarded(c, func() (bool, error) { return c.validator.IsValid(), nil })
	return ok
}
