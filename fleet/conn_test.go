package fleet

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"testing"
)

// A connection's tag is sqlLockShared with the fleet's Conns key and the
// member's id as its arguments, through whichever way the driver runs a
// statement.
func TestATagBindsTheFleetsKeyAndTheMembersID(t *testing.T) {
	m := &Member{name: "tags", keys: LockKeys("tags")}
	m.id.Store(1<<31 - 1)
	want := fmt.Sprint([]any{sqlLockShared, int64(m.keys.Conns), int64(1<<31 - 1)})
	for _, c := range []struct {
		name string
		conn driver.Conn
	}{
		{"ExecerContext", &execerConn{}},
		{"Prepare then StmtExecContext", &recConn{stmtCtx: true}},
		{"Prepare then Exec", &recConn{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := m.tag(context.Background(), c.conn); err != nil {
				t.Fatal(err)
			}
			var got []any
			switch cn := c.conn.(type) {
			case *execerConn:
				got = cn.got
			case *recConn:
				got = cn.got
			}
			if fmt.Sprint(got) != want {
				t.Fatalf("the tag ran %v, want %v", got, want)
			}
		})
	}
}

// recConn records the statement it prepares and the arguments of its
// execution, as a driver.Conn without ExecerContext; its statements have
// StmtExecContext if stmtCtx.
type recConn struct {
	stmtCtx bool
	got     []any
}

func (c *recConn) Prepare(q string) (driver.Stmt, error) {
	c.got = []any{q}
	if c.stmtCtx {
		return &recStmtCtx{recStmt{c}}, nil
	}
	return &recStmt{c}, nil
}
func (c *recConn) Close() error              { return nil }
func (c *recConn) Begin() (driver.Tx, error) { return nil, errors.New("no transactions") }

type execerConn struct{ recConn }

func (c *execerConn) ExecContext(_ context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	c.got = []any{q}
	for _, a := range args {
		c.got = append(c.got, a.Value)
	}
	return driver.RowsAffected(1), nil
}

type recStmt struct{ c *recConn }

func (s *recStmt) Close() error  { return nil }
func (s *recStmt) NumInput() int { return -1 }
func (s *recStmt) Exec(args []driver.Value) (driver.Result, error) {
	for _, a := range args {
		s.c.got = append(s.c.got, a)
	}
	return driver.RowsAffected(1), nil
}
func (s *recStmt) Query([]driver.Value) (driver.Rows, error) { return nil, errors.New("no queries") }

type recStmtCtx struct{ recStmt }

func (s *recStmtCtx) ExecContext(_ context.Context, args []driver.NamedValue) (driver.Result, error) {
	for _, a := range args {
		s.c.got = append(s.c.got, a.Value)
	}
	return driver.RowsAffected(1), nil
}
