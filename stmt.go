package bulkhead

import (
	"context"
	"database/sql/driver"
	"sync"
)

// stmt is a prepared statement as database/sql sees it: one per query text
// and logical connection. The driver's statement is prepared on the
// session that runs it, once per session and query, and closed there once
// no statement of the query is open (query.refs).
//
// database/sql prepares a *sql.Stmt again on each connection it runs it
// on, before the execution reaches the gate. On a connection that holds no
// session, a text the gate prepared before is then not sent: it is
// prepared on the server when it first runs there, under the execution's
// permits, so that an execution refused at admission sends nothing. Any
// other Prepare is sent at once, as without the gate (so that a
// syntax error is reported by Prepare).
type stmt struct {
	c      *conn
	q      *query
	closed bool
}

var (
	_ driver.Stmt              = (*stmt)(nil)
	_ driver.StmtExecContext   = (*stmt)(nil)
	_ driver.StmtQueryContext  = (*stmt)(nil)
	_ driver.NamedValueChecker = (*stmt)(nil)
)

// query is a statement text with open statements, shared by them.
type query struct {
	text string
	refs int        // the gate's open statements of it; under statements.mu
	on   []*session // the sessions that prepared it; under pool.mu
}

// statements are the gate's prepared texts.
type statements struct {
	mu    sync.Mutex
	open  map[string]*query   // the texts with open statements
	known map[string]struct{} // texts prepared once, at most maxKnown
}

// maxKnown bounds the texts a gate remembers: beyond it, a text prepared
// for the first time on a connection with no session is sent at once.
const maxKnown = 4096

// openQuery counts one more statement of text, and reports whether the
// text was prepared once before.
func (ss *statements) openQuery(text string) (q *query, known bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	q = ss.open[text]
	if q == nil {
		if ss.open == nil {
			ss.open = map[string]*query{}
		}
		q = &query{text: text}
		ss.open[text] = q
	}
	q.refs++
	_, known = ss.known[text]
	return q, known
}

func (ss *statements) learn(text string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.known == nil {
		ss.known = map[string]struct{}{}
	}
	if len(ss.known) < maxKnown {
		ss.known[text] = struct{}{}
	}
}

// closeQuery counts one statement of q fewer, and reports whether it was
// the last: then q's driver statements are to be closed everywhere.
func (ss *statements) closeQuery(q *query) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	q.refs--
	if q.refs > 0 {
		return false
	}
	if ss.open[q.text] == q {
		delete(ss.open, q.text)
	}
	return true
}

// Prepare is the legacy form of PrepareContext.
func (c *conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// PrepareContext prepares without a permit: preparing runs no user work.
// A text prepared before is not sent from a connection with no session
// (see stmt); otherwise c takes a session, kept until database/sql takes c
// back, and the driver prepares it there.
func (c *conn) PrepareContext(ctx context.Context, text string) (driver.Stmt, error) {
	if c.bad {
		return nil, driver.ErrBadConn
	}
	q, known := c.g.stmts.openQuery(text)
	st := &stmt{c: c, q: q}
	if (c.s == nil || c.parked) && known {
		return st, nil
	}
	_, err := c.session(ctx)
	if err == nil {
		returned := false
		defer c.finish(nil, &returned)
		_, err = st.on(ctx)
		returned = true
	}
	if err != nil {
		st.Close()
		return nil, ctxErr(ctx, err)
	}
	c.g.stmts.learn(text)
	return st, nil
}

// on returns the driver's statement of st on c's session, preparing it
// there first if needed.
func (st *stmt) on(ctx context.Context) (driver.Stmt, error) {
	s := st.c.s
	if si, ok := s.stmts[st.q]; ok {
		return si, nil
	}
	si, err := s.prepare(ctx, st.q.text)
	if err != nil {
		return nil, err
	}
	if s.stmts == nil {
		s.stmts = map[*query]driver.Stmt{}
	}
	s.stmts[st.q] = si
	st.c.g.pool.preparedOn(st.q, s)
	return si, nil
}

// NumInput is -1: the count is checked once the driver's statement is
// known, after its own checkers converted the arguments (convertArgs).
func (st *stmt) NumInput() int { return -1 }

// CheckNamedValue accepts every argument as it is (see convertArgs).
func (st *stmt) CheckNamedValue(*driver.NamedValue) error { return nil }

// Close closes the statement. The last one of its text closes the
// driver's statements of it: on c's session now, on the others before
// their next use.
func (st *stmt) Close() error {
	if st.closed {
		return nil
	}
	st.closed = true
	if st.c.g.stmts.closeQuery(st.q) {
		p := st.c.g.pool
		p.closeEverywhere(st.q) // a parked session included
		if s := st.c.s; s != nil && !st.c.parked {
			p.closePending(s)
		}
	}
	return nil
}

// Exec is the legacy form of ExecContext.
func (st *stmt) Exec(args []driver.Value) (driver.Result, error) {
	return st.ExecContext(context.Background(), valueToNamedValue(args))
}

// Query is the legacy form of QueryContext.
func (st *stmt) Query(args []driver.Value) (driver.Rows, error) {
	return st.QueryContext(context.Background(), valueToNamedValue(args))
}

// ExecContext runs the statement under both permits, or under those of
// c's open transaction.
func (st *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	c := st.c
	p, err := c.startExec(ctx)
	if err != nil {
		return nil, err
	}
	returned := false
	defer c.finish(p, &returned)
	r, err := st.exec(ctx, args)
	returned = true
	return r, ctxErr(ctx, err)
}

func (st *stmt) exec(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	si, err := st.on(ctx)
	if err != nil {
		return nil, err
	}
	return stmtExec(ctx, st.c.s, si, args)
}

// QueryContext runs the statement; its rows hold both permits until they
// are closed, or, in c's open transaction, are the driver's own.
func (st *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return st.c.runQuery(ctx, func() (driver.Rows, driver.Stmt, error) {
		ri, err := st.query(ctx, args)
		return ri, nil, err
	})
}

func (st *stmt) query(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	si, err := st.on(ctx)
	if err != nil {
		return nil, err
	}
	return stmtQuery(ctx, st.c.s, si, args)
}

// stmtExec converts args for the driver's statement si on s and runs it
// as database/sql would: its context form if it has one, else the legacy
// form after the checks database/sql makes.
func stmtExec(ctx context.Context, s *session, si driver.Stmt, args []driver.NamedValue) (driver.Result, error) {
	args, err := convertArgs(args, s.checker, si)
	if err != nil {
		return nil, err
	}
	if e, ok := si.(driver.StmtExecContext); ok {
		return e.ExecContext(ctx, args)
	}
	dargs, err := namedValueToValue(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return si.Exec(dargs) //lint:ignore SA1019 legacy drivers have nothing else
}

func stmtQuery(ctx context.Context, s *session, si driver.Stmt, args []driver.NamedValue) (driver.Rows, error) {
	args, err := convertArgs(args, s.checker, si)
	if err != nil {
		return nil, err
	}
	if q, ok := si.(driver.StmtQueryContext); ok {
		return q.QueryContext(ctx, args)
	}
	dargs, err := namedValueToValue(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return si.Query(dargs) //lint:ignore SA1019 legacy drivers have nothing else
}
