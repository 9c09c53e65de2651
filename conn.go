package bulkhead

import (
	"context"
	"database/sql/driver"
	"errors"
)

// conn is a logical connection: what database/sql keeps in its pool. It
// holds a server connection (a session, pool.go) only from the moment an
// operation on it holds its permits, or a Ping, a Prepare or Raw needs one,
// until database/sql takes it back (IsValid) or closes it.
//
// It offers every optional driver interface, and answers as database/sql
// would when the driver's connection lacks one: a Ping without Pinger
// succeeds, an Exec without Execer is prepared and executed, arguments are
// converted by the driver's own checkers on the session that runs them. The
// exception is database/sql's rule for a transaction rolled back after its
// context ended, which depends on SessionResetter and Validator: the gate
// has both and applies the rule to the driver's own (tx.Rollback).
//
// database/sql calls a driver connection, and its Tx, Stmt and Rows, one
// call at a time (under its driverConn lock), also from its own goroutines
// (the rollback after a cancellation, closing rows): the plain fields of
// conn, tx, stmt and rows need no lock of their own.
type conn struct {
	g      *Gate
	s      *session // the session held, or nil
	used   bool     // an operation ran on s since database/sql handed c out
	bad    bool     // c is to be discarded: its session was lost, or the driver's rule says so
	idle   bool     // c is idle in database/sql's pool (pool.park, pool.giveBack)
	parked bool     // c is idle, its session s parked (someone else may have taken it since)
	tx     tx       // the open transaction: a connection has at most one
	rows   rows     // an autocommit query's rows, reused while free
	execP  permit   // the permits of the autocommit Exec running on c
}

var (
	_ driver.Conn               = (*conn)(nil)
	_ driver.ConnBeginTx        = (*conn)(nil)
	_ driver.ConnPrepareContext = (*conn)(nil)
	_ driver.ExecerContext      = (*conn)(nil)
	_ driver.QueryerContext     = (*conn)(nil)
	_ driver.Execer             = (*conn)(nil) //lint:ignore SA1019 offered for Raw callers that assert it
	_ driver.Queryer            = (*conn)(nil) //lint:ignore SA1019 offered for Raw callers that assert it
	_ driver.Pinger             = (*conn)(nil)
	_ driver.SessionResetter    = (*conn)(nil)
	_ driver.Validator          = (*conn)(nil)
	_ driver.NamedValueChecker  = (*conn)(nil)
)

// bind gives c a session if it holds none: the one it parked, if still
// there, else one from the pool (pool.get). Sessions the driver finds dead
// on the way are closed and the next one tried. The session is c's while
// the driver checks it: if the driver panics, the caller's deferred lose
// closes it.
func (c *conn) bind(ctx context.Context) error {
	p := c.g.pool
	var s *session
	switch {
	case c.parked:
		c.parked = false
		if p.unpark(c.s) {
			s = c.s
		} else {
			c.s = nil // taken by another connection, or closed
		}
	case c.s != nil:
		return nil
	}
	for {
		if s == nil {
			var err error
			if s, err = p.get(ctx); err != nil {
				return err
			}
		}
		c.s = s
		err := p.ready(ctx, s)
		if err == nil {
			return nil
		}
		c.s = nil
		if ie, ok := err.(*initError); ok {
			p.discard(s, false)
			return ie.err
		}
		if err != errBad { // ctx ended while the driver checked s: it checks s again at its next use
			p.put(s, true)
			return err
		}
		p.discard(s, true)
		s = nil
	}
}

// lose discards c's session after the driver panicked on it: its state is
// unknown. database/sql never discards a connection whose driver call
// panicked, so c reports driver.ErrBadConn from now on, and a transaction
// open on it gives its permits back.
func (c *conn) lose() {
	c.bad = true
	if s := c.s; s != nil {
		c.s = nil
		c.g.pool.discard(s, false)
	}
	c.tx.end()
}

// start takes the permits of an operation of kind k into p, then a
// session if c has none. On success the operation is counted as admitted
// and must end with c.g.release(p); on failure nothing is held.
func (c *conn) start(ctx context.Context, k Kind, p *permit) error {
	if err := c.g.acquire(ctx, k, p); err != nil {
		return err
	}
	if c.s == nil || c.parked {
		ok := false
		defer func() {
			if !ok { // the driver panicked while its session was checked
				c.lose()
				c.g.abort(p, errPanicked)
			}
		}()
		err := c.bind(ctx)
		ok = true
		if err != nil {
			c.g.abort(p, err)
			return ctxErr(ctx, err)
		}
	}
	c.used = true
	c.g.admitted(p)
	return nil
}

var errPanicked = errors.New("bulkhead: the driver panicked")

// finish is deferred by a method that calls the driver on c's session,
// under the operation's permits p (nil for none of its own): if the
// driver panicked (returned is still false), c's session is lost, and
// then p is released; the panic goes on up.
func (c *conn) finish(p *permit, returned *bool) {
	if !*returned {
		c.lose()
	}
	if p != nil {
		c.g.release(p)
	}
}

// session returns c's session for a call outside an operation (Ping,
// Prepare, Raw), binding one if needed; it stays bound until database/sql
// takes c back.
func (c *conn) session(ctx context.Context) (*session, error) {
	if c.bad {
		return nil, driver.ErrBadConn
	}
	ok := false
	defer func() {
		if !ok {
			c.lose()
		}
	}()
	err := c.bind(ctx)
	ok = true
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	c.used = true
	return c.s, nil
}

// Unwrap returns the driver's own connection, binding a session to c if
// it has none: see the package function Unwrap.
func (c *conn) Unwrap() (driver.Conn, error) {
	s, err := c.session(context.Background())
	if err != nil {
		return nil, err
	}
	return s.ci, nil
}

// Unwrap returns the driver's own connection behind dc, the value that
// (*sql.Conn).Raw passes to its function, peeling every wrapper that has
// an Unwrap() (driver.Conn, error) or Unwrap() driver.Conn method; any
// other value is returned as it is. Behind a gate it gives the *sql.Conn a
// server connection, kept until the *sql.Conn is closed, and returns an
// error if none could be had (the dial failed, or the gate is closed).
// Work done on the driver's connection is not gated.
//
//	err := sqlConn.Raw(func(dc any) error {
//		c, err := bulkhead.Unwrap(dc)
//		if err != nil {
//			return err
//		}
//		pgxConn := c.(*stdlib.Conn).Conn()
//		...
//	})
func Unwrap(dc any) (any, error) {
	for {
		switch u := dc.(type) {
		case interface{ Unwrap() (driver.Conn, error) }:
			inner, err := u.Unwrap()
			if err != nil {
				return nil, err
			}
			dc = inner
		case interface{ Unwrap() driver.Conn }:
			dc = u.Unwrap()
		default:
			return dc, nil
		}
	}
}

// ResetSession is called by database/sql when it hands c out again. c
// holds no session then: the driver resets the one c takes later, once the
// operation holds its permits, so that a rejection sends nothing.
func (c *conn) ResetSession(context.Context) error {
	if c.idle {
		c.idle = false
		c.g.pool.idleLogical.Add(-1)
	}
	// A parked session another connection took and closed (found dead):
	// database/sql would have discarded this connection, unless an idle
	// session is left for it.
	if c.parked && c.s.state.Load() == gone {
		c.parked, c.s = false, nil
		c.bad = c.g.pool.excess(-1)
	}
	if c.bad {
		return driver.ErrBadConn
	}
	return nil
}

// IsValid is called by database/sql when it takes c back: c parks its
// session, after the driver's Validator, if it has one, agreed, unless
// pool.park declines. Without a session, c stays in database/sql's pool only while the idle connections
// there are fewer than the gate's idle server connections
// (pool.giveBack): one a dead server connection left without one is
// discarded, as database/sql would have discarded the dead one.
func (c *conn) IsValid() bool {
	if c.bad {
		return false
	}
	if c.parked { // nothing took the session back since c was handed out (a rejection, a lazy Prepare)
		c.parked = false
		if !c.g.pool.unpark(c.s) {
			c.s = nil
		}
	}
	s := c.s
	if s != nil && s.validator != nil && !s.validator.IsValid() {
		c.s = nil
		c.g.pool.discard(s, true)
		return false
	}
	if s != nil && c.g.pool.park(s, c.used) {
		c.parked, c.idle, c.used = true, true, false
		return true
	}
	c.s = nil
	c.idle = c.g.pool.giveBack(s, c.used, true)
	c.used = false
	return c.idle
}

// Close closes the logical connection, and its session if it still holds
// one (database/sql closes a connection it did not take back when it
// found it bad). A transaction still open on it gives its permits back.
func (c *conn) Close() error {
	if s := c.s; s != nil {
		c.s = nil
		if !c.parked || c.g.pool.unpark(s) {
			c.g.pool.discard(s, false)
		}
		c.parked = false
	}
	c.tx.end()
	c.g.pool.logicalClosed(c.idle)
	c.idle = false
	return nil
}

// CheckNamedValue accepts every argument as it is: the driver's own
// checkers convert it once the session that runs it is known (convert.go).
func (c *conn) CheckNamedValue(*driver.NamedValue) error { return nil }

// Ping is not gated (health checks must answer under overload), but it
// needs a session. A driver without Pinger answers nil, as database/sql
// does.
func (c *conn) Ping(ctx context.Context) error {
	s, err := c.session(ctx)
	if err != nil || s.pinger == nil {
		return err
	}
	returned := false
	defer c.finish(nil, &returned)
	err = s.pinger.Ping(ctx)
	returned = true
	return ctxErr(ctx, err)
}

// Begin is the legacy form of BeginTx.
func (c *conn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

// BeginTx takes both permits and a session, then begins. The permits are
// held until the driver's Commit or Rollback returns.
func (c *conn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if c.bad {
		return nil, driver.ErrBadConn
	}
	if c.tx.open {
		return nil, ErrTxStillOpen
	}
	if err := c.start(ctx, KindTx, &c.tx.p); err != nil {
		return nil, err
	}
	// Open from here: if the driver panics, lose releases the permits.
	c.tx.ctx, c.tx.open = ctx, true
	returned := false
	defer c.finish(nil, &returned)
	ti, err := c.s.begin(ctx, opts)
	returned = true
	if err != nil {
		c.tx.end() // before database/sql may retry (driver.ErrBadConn)
		return nil, ctxErr(ctx, err)
	}
	c.tx.inner = ti
	return &c.tx, nil
}

// inTx checks a statement of c's open transaction: it takes no permit,
// but if that transaction is dying (its context ended and database/sql has
// not rolled it back yet) it would run inside it and vanish with it:
// refused with ErrTxStillOpen, or the statement's own context's error.
func (c *conn) inTx(ctx context.Context) error {
	if c.tx.ctx.Err() == nil {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return ErrTxStillOpen
}

// Exec is the legacy form of ExecContext.
func (c *conn) Exec(query string, args []driver.Value) (driver.Result, error) {
	return c.ExecContext(context.Background(), query, valueToNamedValue(args))
}

// ExecContext runs an autocommit statement under both permits, or a
// statement of the open transaction under the transaction's.
func (c *conn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	p, err := c.startExec(ctx)
	if err != nil {
		return nil, err
	}
	returned := false
	defer c.finish(p, &returned)
	r, err := c.exec(ctx, query, args)
	returned = true
	return r, ctxErr(ctx, err)
}

// startExec checks c for a statement: an autocommit one takes both
// permits into c.execP, returned to be released at its end; one of the
// open transaction takes none (nil).
func (c *conn) startExec(ctx context.Context) (*permit, error) {
	if c.bad {
		return nil, driver.ErrBadConn
	}
	if c.tx.open {
		return nil, c.inTx(ctx)
	}
	if err := c.start(ctx, KindExec, &c.execP); err != nil {
		return nil, err
	}
	return &c.execP, nil
}

// exec runs query on c's session. When the driver has no Execer, or
// answers driver.ErrSkip (go-sql-driver/mysql does for a statement with
// arguments unless interpolateParams is set), it runs database/sql's
// fallback itself, prepare, execute, close, so that the permits already
// held cover the whole operation.
func (c *conn) exec(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	s := c.s
	if s.execer != nil || s.legacyExecer != nil {
		cargs, err := convertArgs(args, s.checker, nil)
		if err != nil {
			return nil, err
		}
		r, err := s.exec(ctx, query, cargs)
		if err != driver.ErrSkip {
			return r, err
		}
		// Converted in place: the statement converts them again, which
		// leaves a driver.Value as it is for every converter we know.
		args = cargs
	}
	si, err := s.prepare(ctx, query)
	if err != nil {
		return nil, err
	}
	defer si.Close()
	return stmtExec(ctx, s, si, args)
}

// Query is the legacy form of QueryContext.
func (c *conn) Query(query string, args []driver.Value) (driver.Rows, error) {
	return c.QueryContext(context.Background(), query, valueToNamedValue(args))
}

// QueryContext runs an autocommit query whose rows hold both permits until
// they are closed, or a query of the open transaction (its rows are then
// the driver's own).
func (c *conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	return c.runQuery(ctx, func() (driver.Rows, driver.Stmt, error) { return c.query(ctx, query, args) })
}

// runQuery runs a query, run, that returns the driver's rows and the
// statement to close with them, if any: in c's open transaction, under its
// permits, else as an autocommit query (runRows).
func (c *conn) runQuery(ctx context.Context, run func() (driver.Rows, driver.Stmt, error)) (driver.Rows, error) {
	if c.bad {
		return nil, driver.ErrBadConn
	}
	if !c.tx.open {
		return c.runRows(ctx, run)
	}
	if err := c.inTx(ctx); err != nil {
		return nil, err
	}
	returned := false
	defer c.finish(nil, &returned)
	ri, si, err := run()
	returned = true
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	if si != nil { // the fallback's statement, closed with its rows
		return &rows{c: c, inner: ri, stmt: si}, nil
	}
	return ri, nil
}

// query runs query on c's session, with database/sql's fallback as exec;
// the fallback's statement is returned, to be closed after the rows.
func (c *conn) query(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, driver.Stmt, error) {
	s := c.s
	if s.queryer != nil || s.legacyQueryer != nil {
		cargs, err := convertArgs(args, s.checker, nil)
		if err != nil {
			return nil, nil, err
		}
		ri, err := s.query(ctx, query, cargs)
		if err != driver.ErrSkip {
			return ri, nil, err
		}
		args = cargs // as in exec
	}
	si, err := s.prepare(ctx, query)
	if err != nil {
		return nil, nil, err
	}
	ri, err := stmtQuery(ctx, s, si, args)
	if err != nil {
		si.Close()
		return nil, nil, err
	}
	return ri, si, nil
}

// runRows runs an autocommit query, run, under both permits and a
// session, taken into the rows that will hold them until they are closed:
// c's own, or new ones while c's are still open (two result sets at once
// on a *sql.Conn). run returns the driver's rows and the statement to
// close with them, if any. On an error or a panic the permits come back
// at once.
func (c *conn) runRows(ctx context.Context, run func() (driver.Rows, driver.Stmt, error)) (driver.Rows, error) {
	r := &c.rows
	if r.open {
		r = &rows{c: c}
	}
	if err := c.start(ctx, KindQuery, &r.p); err != nil {
		return nil, err
	}
	returned, handed := false, false
	defer func() {
		if !returned {
			c.lose()
		}
		if !handed {
			c.g.release(&r.p)
		}
	}()
	ri, si, err := run()
	returned = true
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	r.inner, r.stmt, r.open = ri, si, true
	handed = true
	return r, nil
}

// tx is the open transaction of a conn. It holds both permits from
// BeginTx until the driver's Commit or Rollback returns, on whatever
// goroutine calls it (database/sql rolls back from its own goroutine when
// the transaction's context ends).
type tx struct {
	c     *conn
	inner driver.Tx
	ctx   context.Context // BeginTx's
	p     permit
	open  bool // begun, and its permits not released yet
}

func (t *tx) Commit() error {
	returned := false
	defer t.finish(&returned)
	err := t.inner.Commit()
	returned = true
	return ctxErr(t.ctx, err)
}

// Rollback rolls back in the driver. After the transaction's context
// ended (database/sql's own rollback, as a rule) the connection is then
// discarded unless the driver can reset and validate it: database/sql's
// rule for its own pool (keepConnOnRollback).
func (t *tx) Rollback() error {
	returned := false
	defer t.finish(&returned)
	if s := t.c.s; s != nil && (s.resetter == nil || s.validator == nil) && t.ctx.Err() != nil {
		t.c.bad = true
	}
	err := t.inner.Rollback()
	returned = true
	return ctxErr(t.ctx, err)
}

// finish is deferred by Commit and Rollback: the session is lost if the
// driver panicked, then the permits are released.
func (t *tx) finish(returned *bool) {
	if !*returned {
		t.c.lose()
	}
	t.end()
}

// end releases the transaction's permits, once.
func (t *tx) end() {
	if t.open {
		t.open = false
		t.c.g.release(&t.p)
	}
}

func valueToNamedValue(args []driver.Value) []driver.NamedValue {
	named := make([]driver.NamedValue, len(args))
	for i, v := range args {
		named[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return named
}
