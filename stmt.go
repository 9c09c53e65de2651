package bulkhead

import (
	"container/list"
	"context"
	"database/sql/driver"
	"sync"

	"github.com/dbbulkhead/bulkhead/internal/sessions"
)

// stmt is a prepared statement of one logical connection. The driver's is
// prepared once per session and query text, on the session that runs it,
// and closed once no stmt of the text is open. From a connection with no
// session, a known text (statements) is sent only when it runs, under its
// permits.
type stmt struct {
	c      *conn
	q      *query
	closed bool
}

// query is a statement text with open statements, shared by them.
type query struct {
	sessions.Query      // its text, and the sessions that prepared it
	refs           int  // the gate's open statements of it; under statements.mu
	prepared       bool // the driver prepared it once; under statements.mu
}

// statements are the gate's prepared texts: those with open statements,
// and the maxKnown prepared most recently (least recently prepared out).
type statements struct {
	mu    sync.Mutex
	open  map[string]*query // the texts with open statements
	known map[string]*list.Element
	lru   list.List // of known texts, the one prepared last first
}

// maxKnown bounds the texts a gate remembers as prepared once beyond those
// with open statements.
const maxKnown = 4096

// openQuery counts one more statement of text; known: it was prepared once.
func (ss *statements) openQuery(text string) (q *query, known bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	q = ss.open[text]
	if q == nil {
		if ss.open == nil {
			ss.open, ss.known = map[string]*query{}, map[string]*list.Element{}
		}
		q = &query{Query: sessions.Query{Text: text}}
		ss.open[text] = q
	}
	q.refs++
	_, known = ss.known[text]
	return q, known || q.prepared
}

// learn marks q's text as prepared once.
func (ss *statements) learn(q *query) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	q.prepared = true
	if e, ok := ss.known[q.Text]; ok {
		ss.lru.MoveToFront(e)
		return
	}
	if ss.lru.Len() >= maxKnown {
		delete(ss.known, ss.lru.Remove(ss.lru.Back()).(string))
	}
	ss.known[q.Text] = ss.lru.PushFront(q.Text)
}

// closeQuery counts one statement of q fewer, and reports whether it was
// the last: q's driver statements are then to be closed.
func (ss *statements) closeQuery(q *query) bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	q.refs--
	if q.refs > 0 {
		return false
	}
	delete(ss.open, q.Text) // q is ss.open[q.Text] while it has refs
	return true
}

// Prepare is the legacy form of PrepareContext.
func (c *conn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// PrepareContext prepares without a permit: on c's session, bound if
// needed, unless c has none and the text is known (see stmt).
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
	return st, nil
}

// on returns st's driver statement on c's session, prepared if needed.
func (st *stmt) on(ctx context.Context) (driver.Stmt, error) {
	s := st.c.s
	if si, ok := s.Stmt(&st.q.Query); ok {
		return si, nil
	}
	si, err := s.Prepare(ctx, st.q.Text)
	if err != nil {
		return nil, err
	}
	st.c.g.pool.Prepared(&st.q.Query, s, si)
	st.c.g.stmts.learn(st.q)
	return si, nil
}

// NumInput is -1: convert.Args checks the count against the driver's.
func (st *stmt) NumInput() int { return -1 }

// CheckNamedValue accepts every argument as it is (see convert.Args).
func (st *stmt) CheckNamedValue(*driver.NamedValue) error { return nil }

// Close closes st; the last of its text closes the driver's statements.
func (st *stmt) Close() error {
	if st.closed {
		return nil
	}
	st.closed = true
	if st.c.g.stmts.closeQuery(st.q) {
		p := st.c.g.pool
		p.CloseEverywhere(&st.q.Query) // a parked session included
		if s := st.c.s; s != nil && !st.c.parked {
			p.ClosePending(s)
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

// ExecContext runs st under both permits, or in c's open transaction.
func (st *stmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	c := st.c
	p, err := c.startExec(ctx, st.q.Text)
	if err != nil {
		return nil, err
	}
	returned := false
	defer c.finish(p, &returned)
	var r driver.Result
	si, err := st.on(ctx)
	if err == nil {
		r, err = c.s.ExecStmt(ctx, si, args)
	}
	returned = true
	return r, opErr(ctx, err)
}

// QueryContext runs st as conn.QueryContext runs a query.
func (st *stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return st.c.runQuery(ctx, st.q.Text, func() (driver.Rows, driver.Stmt, error) {
		si, err := st.on(ctx)
		if err != nil {
			return nil, nil, err
		}
		ri, err := st.c.s.QueryStmt(ctx, si, args)
		return ri, nil, err
	})
}
