package fleet

import (
	"context"
	"database/sql/driver"
	"fmt"
	"io"
)

// The member's gate's connections: each tagged with the member's id before
// its first use; the gate's Close leaves the fleet.

// tag marks a server connection of the member's gate as its own, before
// its first use (bulkhead.WithConnInit): a shared advisory lock (Conns,
// id) that the connection holds as long as it lives, so that the others
// count its work as orphans if this process dies while it runs. A
// connection that cannot be tagged is closed by the gate: its work would
// be invisible.
func (m *Member) tag(ctx context.Context, c driver.Conn) error {
	args := []driver.NamedValue{{Ordinal: 1, Value: int64(m.keys.Conns)}, {Ordinal: 2, Value: m.id.Load()}}
	if err := execConn(ctx, c, sqlLockShared, args); err != nil {
		return fmt.Errorf("bulkhead: fleet %s: tagging a new server connection (fleet.Tagging): %w", m.name, err)
	}
	return nil
}

// connector is the member's gate's inner connector: closing it (the
// gate's Close) leaves the fleet, then closes the inner connector if it is
// an io.Closer.
type connector struct {
	inner driver.Connector
	m     *Member
}

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) { return c.inner.Connect(ctx) }
func (c *connector) Driver() driver.Driver                            { return c.inner.Driver() }

func (c *connector) Close() error {
	c.m.leave()
	if cl, ok := c.inner.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

// execConn runs query with args, valid driver.Values in order, on a
// driver connection.
func execConn(ctx context.Context, c driver.Conn, query string, args []driver.NamedValue) error {
	if e, ok := c.(driver.ExecerContext); ok {
		_, err := e.ExecContext(ctx, query, args)
		if err != driver.ErrSkip {
			return err
		}
	}
	var st driver.Stmt
	var err error
	if p, ok := c.(driver.ConnPrepareContext); ok {
		st, err = p.PrepareContext(ctx, query)
	} else {
		st, err = c.Prepare(query)
	}
	if err != nil {
		return err
	}
	defer st.Close()
	if e, ok := st.(driver.StmtExecContext); ok {
		_, err = e.ExecContext(ctx, args)
		return err
	}
	vals := make([]driver.Value, len(args))
	for i, a := range args {
		vals[i] = a.Value
	}
	_, err = st.Exec(vals) //lint:ignore SA1019 the driver's only way
	return err
}
