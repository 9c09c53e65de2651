package bulkhead

import (
	"context"
	"database/sql/driver"
)

// stmt is a prepared statement of a logical connection. database/sql
// prepares it on the connection and runs it there later, but by then the
// connection may be bound to another server connection (session): the
// statement is then prepared on that one, once, under the execution's
// permits, and kept. Its executions outside a transaction are gated like
// the conn's; inside one (a statement prepared on the transaction, or
// moved into it with Tx.Stmt) they take no permit.
//
// database/sql prepares a *sql.Stmt again on each connection it runs it
// on, before the execution reaches the gate. On a connection with no
// session, when the same query was prepared before (the gate keeps one
// prepared statement per query text while any statement of it is open),
// that preparation sends nothing: the statement is prepared on the server
// when it first runs there. So an execution that is rejected sends
// nothing to the server either.
type stmt struct {
	c      *conn
	query  string
	proto  *stmtProto // answers NumInput and the argument checks
	on_    []stmtOn   // prepared on these sessions
	closed bool
}

// stmtProto is the gate's memory of a query prepared once: a statement
// prepared for it, kept while any statement of the query is open. It
// answers NumInput (asked once, as it was prepared) and the argument checks
// (NamedValueChecker, ColumnConverter) for every statement of the query,
// on whatever connection and goroutine, and maybe after it was itself
// closed: right for drivers whose argument checks depend on the statement
// and the value alone and touch no connection state (pgx has none;
// go-sql-driver/mysql's and ncruces/go-sqlite3's are pure functions of the
// value).
type stmtProto struct {
	si       driver.Stmt
	mask     uint // the optional interfaces of si
	numInput int  // si.NumInput(), asked by the goroutine that prepared it
	refs     int  // open statements of the query; guarded by the gate's stmtMu
}

type stmtOn struct {
	s  *session
	si driver.Stmt
}

var (
	_ driver.Stmt             = (*stmt)(nil)
	_ driver.StmtExecContext  = (*stmt)(nil)
	_ driver.StmtQueryContext = (*stmt)(nil)
)

func (st *stmt) NumInput() int { return st.proto.numInput }

// Close closes the statement on every session it was prepared on: now on
// the session of its connection, and on any other when that session is
// free (pool.closeStmtOn).
func (st *stmt) Close() error {
	if st.closed {
		return nil
	}
	st.closed = true
	var err error
	for _, o := range st.on_ {
		if o.s != st.c.sess {
			st.c.g.pool.closeStmtOn(o.s, o.si)
			continue
		}
		if _, cerr := guarded(st.c, func() (struct{}, error) { return struct{}{}, o.si.Close() }); err == nil {
			err = cerr
		}
	}
	st.on_ = nil
	st.c.g.dropStmtProto(st.query, st.proto)
	return err
}

// on returns the statement prepared on the connection's session,
// preparing it there first if needed.
func (st *stmt) on(ctx context.Context) (driver.Stmt, error) {
	s := st.c.sess
	for _, o := range st.on_ {
		if o.s == s {
			return o.si, nil
		}
	}
	si, err := guarded(st.c, func() (driver.Stmt, error) { return s.prepare(ctx, st.query) })
	if err != nil {
		return nil, err
	}
	st.keep(s, si)
	return si, nil
}

// keep records si, prepared on s, forgetting sessions closed since: their
// statements went with them.
func (st *stmt) keep(s *session, si driver.Stmt) {
	live := st.on_[:0]
	for _, o := range st.on_ {
		if !o.s.gone() {
			live = append(live, o)
		}
	}
	st.on_ = append(live, stmtOn{s, si})
}

// Exec is the legacy form of ExecContext.
func (st *stmt) Exec(args []driver.Value) (driver.Result, error) {
	return st.ExecContext(context.Background(), valueToNamedValue(args))
}

// Query is the legacy form of QueryContext.
func (st *stmt) Query(args []driver.Value) (driver.Rows, error) {
	return st.QueryContext(context.Background(), valueToNamedValue(args))
}

func (st *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	c := st.c
	if c.lost.Load() {
		return nil, driver.ErrBadConn
	}
	if c.tx.held {
		if err := c.inTx(ctx); err != nil {
			return nil, err
		}
		r, err := st.exec(ctx, args)
		return r, ctxErr(ctx, err)
	}
	if err := c.start(ctx, KindExec, &c.exec); err != nil {
		return nil, err
	}
	defer c.g.release(&c.exec)
	r, err := st.exec(ctx, args)
	return r, ctxErr(ctx, err)
}

func (st *stmt) exec(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	si, err := st.on(ctx)
	if err != nil {
		return nil, err
	}
	return guarded(st.c, func() (driver.Result, error) { return stmtExec(ctx, si, args) })
}

func (st *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	c := st.c
	if c.lost.Load() {
		return nil, driver.ErrBadConn
	}
	if c.tx.held {
		if err := c.inTx(ctx); err != nil {
			return nil, err
		}
		ri, err := st.queryOn(ctx, args)
		return ri, ctxErr(ctx, err)
	}
	r, err := c.startRows(ctx)
	if err != nil {
		return nil, err
	}
	return st.runRows(ctx, r, args)
}

// runRows runs the statement for r, which holds the permits.
func (st *stmt) runRows(ctx context.Context, r *rows, args []driver.NamedValue) (driver.Rows, error) {
	return st.c.runRows(ctx, r, func() (driver.Rows, driver.Stmt, error) {
		ri, err := st.queryOn(ctx, args)
		return ri, nil, err
	})
}

func (st *stmt) queryOn(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	si, err := st.on(ctx)
	if err != nil {
		return nil, err
	}
	return guarded(st.c, func() (driver.Rows, error) { return stmtQuery(ctx, si, args) })
}
