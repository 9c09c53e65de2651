package sessions

import (
	"context"
	"database/sql/driver"
	"errors"
	"sync/atomic"

	"github.com/dbbulkhead/bulkhead/internal/convert"
)

// Session states: held by one holder, parked, or closed.
const (
	held int32 = iota
	parked
	gone
)

// Session is a driver connection and its optional interfaces. Its plain
// fields belong to its one holder, and pass to the next through state.
type Session struct {
	Conn      driver.Conn
	Pinger    driver.Pinger            // or nil
	Resetter  driver.SessionResetter   // or nil
	Validator driver.Validator         // or nil
	Checker   driver.NamedValueChecker // or nil

	execer        driver.ExecerContext
	queryer       driver.QueryerContext
	legacyExecer  driver.Execer  //lint:ignore SA1019 legacy drivers have nothing else
	legacyQueryer driver.Queryer //lint:ignore SA1019 legacy drivers have nothing else
	preparer      driver.ConnPrepareContext
	beginner      driver.ConnBeginTx

	dirty   bool                   // used since the driver last reset it
	inited  bool                   // WithConnInit's function ran on it
	checked uint64                 // the pool's epoch when it was last known alive
	stmts   map[*Query]driver.Stmt // statements prepared on it
	pending []*Query               // statements to close before its next use; under Pool.mu
	closing atomic.Bool            // pending is not empty
	state   atomic.Int32           // held, parked or gone
}

// Query is a statement text, prepared on sessions.
type Query struct {
	Text string
	on   []*Session // the sessions that prepared it; under Pool.mu
}

func newSession(ci driver.Conn) *Session {
	s := &Session{Conn: ci, stmts: map[*Query]driver.Stmt{}}
	s.execer, _ = ci.(driver.ExecerContext)
	s.queryer, _ = ci.(driver.QueryerContext)
	s.legacyExecer, _ = ci.(driver.Execer)   //lint:ignore SA1019 legacy drivers have nothing else
	s.legacyQueryer, _ = ci.(driver.Queryer) //lint:ignore SA1019 legacy drivers have nothing else
	s.preparer, _ = ci.(driver.ConnPrepareContext)
	s.beginner, _ = ci.(driver.ConnBeginTx)
	s.Pinger, _ = ci.(driver.Pinger)
	s.Resetter, _ = ci.(driver.SessionResetter)
	s.Validator, _ = ci.(driver.Validator)
	s.Checker, _ = ci.(driver.NamedValueChecker)
	return s
}

// take holds a parked s; anyone but its logical connection holds p.mu.
func (s *Session) take() bool { return s.state.CompareAndSwap(parked, held) }

// closeQuietly closes c, ignoring its error and a panic.
func closeQuietly(c interface{ Close() error }) {
	defer func() { _ = recover() }()
	c.Close()
}

// Stmt returns q's driver statement on s, if s prepared it.
func (s *Session) Stmt(q *Query) (driver.Stmt, bool) {
	si, ok := s.stmts[q]
	return si, ok
}

// Gone reports whether s was closed.
func (s *Session) Gone() bool { return s.state.Load() == gone }

// The driver calls on a session, made as database/sql makes them.

func (s *Session) Prepare(ctx context.Context, query string) (driver.Stmt, error) {
	if s.preparer != nil {
		return s.preparer.PrepareContext(ctx, query)
	}
	si, err := s.Conn.Prepare(query)
	if err == nil && ctx.Err() != nil {
		si.Close()
		return nil, ctx.Err()
	}
	return si, err
}

func (s *Session) Begin(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if s.beginner != nil {
		return s.beginner.BeginTx(ctx, opts)
	}
	if opts.Isolation != driver.IsolationLevel(0) {
		return nil, errors.New("bulkhead: driver does not support non-default isolation level")
	}
	if opts.ReadOnly {
		return nil, errors.New("bulkhead: driver does not support read-only transactions")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ti, err := s.Conn.Begin() //lint:ignore SA1019 legacy drivers have nothing else
	if err == nil && ctx.Err() != nil {
		ti.Rollback()
		return nil, ctx.Err()
	}
	return ti, err
}

// Exec runs query on s; without the driver's Execer, or on driver.ErrSkip,
// it prepares, executes and closes, as database/sql would.
func (s *Session) Exec(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if s.execer != nil || s.legacyExecer != nil {
		cargs, err := convert.Args(args, s.Checker, nil)
		if err != nil {
			return nil, err
		}
		r, err := s.exec(ctx, query, cargs)
		if err != driver.ErrSkip {
			return r, err
		}
		args = cargs // converting a driver.Value again leaves it as it is
	}
	si, err := s.Prepare(ctx, query)
	if err != nil {
		return nil, err
	}
	defer si.Close()
	return s.ExecStmt(ctx, si, args)
}

// Query is Exec for a query; it returns the fallback's statement, if any,
// to close with the rows.
func (s *Session) Query(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, driver.Stmt, error) {
	if s.queryer != nil || s.legacyQueryer != nil {
		cargs, err := convert.Args(args, s.Checker, nil)
		if err != nil {
			return nil, nil, err
		}
		ri, err := s.query(ctx, query, cargs)
		if err != driver.ErrSkip {
			return ri, nil, err
		}
		args = cargs // as in Exec
	}
	si, err := s.Prepare(ctx, query)
	if err != nil {
		return nil, nil, err
	}
	ri, err := s.QueryStmt(ctx, si, args)
	if err != nil {
		si.Close()
		return nil, nil, err
	}
	return ri, si, nil
}

func (s *Session) exec(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if s.execer != nil {
		return s.execer.ExecContext(ctx, query, args)
	}
	dargs, err := legacyArgs(ctx, args)
	if err != nil {
		return nil, err
	}
	return s.legacyExecer.Exec(query, dargs) //lint:ignore SA1019 legacy drivers have nothing else
}

func (s *Session) query(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if s.queryer != nil {
		return s.queryer.QueryContext(ctx, query, args)
	}
	dargs, err := legacyArgs(ctx, args)
	if err != nil {
		return nil, err
	}
	return s.legacyQueryer.Query(query, dargs) //lint:ignore SA1019 legacy drivers have nothing else
}

// legacyArgs checks args for a legacy driver call: no names, ctx not ended.
func legacyArgs(ctx context.Context, named []driver.NamedValue) ([]driver.Value, error) {
	args := make([]driver.Value, len(named))
	for i, nv := range named {
		if nv.Name != "" {
			return nil, errors.New("bulkhead: driver does not support the use of named parameters")
		}
		args[i] = nv.Value
	}
	return args, ctx.Err()
}

// ExecStmt and QueryStmt convert args for si, prepared on s, and run it.
func (s *Session) ExecStmt(ctx context.Context, si driver.Stmt, args []driver.NamedValue) (driver.Result, error) {
	args, err := convert.Args(args, s.Checker, si)
	if err != nil {
		return nil, err
	}
	if e, ok := si.(driver.StmtExecContext); ok {
		return e.ExecContext(ctx, args)
	}
	dargs, err := legacyArgs(ctx, args)
	if err != nil {
		return nil, err
	}
	return si.Exec(dargs) //lint:ignore SA1019 legacy drivers have nothing else
}

func (s *Session) QueryStmt(ctx context.Context, si driver.Stmt, args []driver.NamedValue) (driver.Rows, error) {
	args, err := convert.Args(args, s.Checker, si)
	if err != nil {
		return nil, err
	}
	if q, ok := si.(driver.StmtQueryContext); ok {
		return q.QueryContext(ctx, args)
	}
	dargs, err := legacyArgs(ctx, args)
	if err != nil {
		return nil, err
	}
	return si.Query(dargs) //lint:ignore SA1019 legacy drivers have nothing else
}
