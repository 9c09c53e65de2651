package fakedb

import (
	"context"
	"database/sql/driver"
	"errors"
)

// Conn is a connection of the fake driver. It implements every optional
// interface; Connect returns it as it is for ConnAll, else inside a
// variant that offers fewer (see ConnOf).
type Conn struct {
	fc   *Connector
	id   int64
	tx   Tx
	inTx bool
}

// ID numbers the connections of a Connector from 1 in Connect order.
func (c *Conn) ID() int64 { return c.id }

// InTx reports whether a transaction is open on the connection. Call it
// only while database/sql does not use the connection (inside Raw).
func (c *Conn) InTx() bool { return c.inTx }

func (c *Conn) Prepare(query string) (driver.Stmt, error) { return c.PrepareContext(bg, query) }

// PrepareContext returns a statement implementing the optional interfaces
// in the Connector's Stmt; it panics if that is not one of StmtVariants.
func (c *Conn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if err := c.fc.enter(ctx, OpPrepare, query); err != nil {
		return nil, err
	}
	return wrap("Stmt", stmtVariants, c.fc.Stmt, &Stmt{c: c, sql: query}), nil
}

// Close closes the connection, even when its hook or fault fails it.
func (c *Conn) Close() error {
	defer func() {
		c.fc.mu.Lock()
		delete(c.fc.conns, c)
		c.fc.mu.Unlock()
	}()
	return c.fc.enter(bg, OpConnClose, "")
}

var errInTx = errors.New("fakedb: begin on a connection already in a transaction")

func (c *Conn) Begin() (driver.Tx, error) { return c.BeginTx(bg, driver.TxOptions{}) }

// BeginTx accepts every option and ignores it.
func (c *Conn) BeginTx(ctx context.Context, _ driver.TxOptions) (driver.Tx, error) {
	if err := c.fc.enter(ctx, OpBegin, ""); err != nil {
		return nil, err
	}
	if c.inTx {
		return nil, errInTx
	}
	c.inTx = true
	return &c.tx, nil
}

var result driver.Result = driver.RowsAffected(1)

func (c *Conn) Exec(query string, _ []driver.Value) (driver.Result, error) {
	return c.ExecContext(bg, query, nil)
}

func (c *Conn) ExecContext(ctx context.Context, query string, _ []driver.NamedValue) (driver.Result, error) {
	if err := c.fc.enter(ctx, OpExec, query); err != nil {
		return nil, err
	}
	return result, nil
}

func (c *Conn) Query(query string, args []driver.Value) (driver.Rows, error) {
	return c.QueryContext(bg, query, valuesToNamed(args))
}

func (c *Conn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := c.fc.enter(ctx, OpQuery, query); err != nil {
		return nil, err
	}
	return c.fc.rows(query, args)
}

func (c *Conn) Ping(ctx context.Context) error { return c.fc.enter(ctx, OpPing, "") }

func (c *Conn) ResetSession(ctx context.Context) error {
	return c.fc.enter(ctx, OpResetSession, "")
}

func (c *Conn) IsValid() bool { return c.fc.enter(bg, OpIsValid, "") == nil }

// CheckNamedValue accepts every value, as pgx does: arguments of any Go
// type reach the driver.
func (c *Conn) CheckNamedValue(*driver.NamedValue) error {
	return c.fc.enter(bg, OpCheckNamedValue, "")
}

// Tx is a transaction of the fake driver.
type Tx struct{ c *Conn }

// Commit ends the transaction.
func (t *Tx) Commit() error {
	t.c.inTx = false
	return t.c.fc.enter(bg, OpCommit, "")
}

// Rollback ends the transaction.
func (t *Tx) Rollback() error {
	t.c.inTx = false
	return t.c.fc.enter(bg, OpRollback, "")
}

// Stmt is a prepared statement of the fake driver. It implements every
// optional interface; Prepare returns it inside a variant that offers
// fewer unless the Connector's Stmt is StmtAll.
type Stmt struct {
	c   *Conn
	sql string
}

func (s *Stmt) Close() error { return s.c.fc.enter(bg, OpStmtClose, s.sql) }

// NumInput is -1: the statement takes any number of arguments.
func (s *Stmt) NumInput() int { return -1 }

func (s *Stmt) Exec([]driver.Value) (driver.Result, error) { return s.ExecContext(bg, nil) }

func (s *Stmt) ExecContext(ctx context.Context, _ []driver.NamedValue) (driver.Result, error) {
	if err := s.c.fc.enter(ctx, OpStmtExec, s.sql); err != nil {
		return nil, err
	}
	return result, nil
}

func (s *Stmt) Query(args []driver.Value) (driver.Rows, error) {
	return s.QueryContext(bg, valuesToNamed(args))
}

func (s *Stmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if err := s.c.fc.enter(ctx, OpStmtQuery, s.sql); err != nil {
		return nil, err
	}
	return s.c.fc.rows(s.sql, args)
}

// CheckNamedValue accepts every value, as Conn's does.
func (s *Stmt) CheckNamedValue(*driver.NamedValue) error {
	return s.c.fc.enter(bg, OpCheckNamedValue, s.sql)
}

// ColumnConverter converts as database/sql does by default.
func (s *Stmt) ColumnConverter(int) driver.ValueConverter { return driver.DefaultParameterConverter }

func valuesToNamed(args []driver.Value) []driver.NamedValue {
	if len(args) == 0 {
		return nil
	}
	nv := make([]driver.NamedValue, len(args))
	for i, v := range args {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: v}
	}
	return nv
}
