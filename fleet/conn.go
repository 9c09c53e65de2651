package fleet

import (
	"context"
	"database/sql/driver"
	"fmt"
	"io"
	"strconv"
)

// tag marks a server connection of the member's gate as its own, before
// its first use (bulkhead.WithConnInit): a shared advisory lock (Conns,
// id) that the connection holds as long as it lives, so that the others
// count its work as orphans if this process dies while it runs. A
// connection that cannot be tagged is closed by the gate: its work would
// be invisible.
func (m *Member) tag(ctx context.Context, c driver.Conn) error {
	q := "SELECT pg_advisory_lock_shared(" + itoa32(m.keys.Conns) + ", " + strconv.FormatInt(m.id.Load(), 10) + ")"
	if err := execConn(ctx, c, q); err != nil {
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

// execConn runs query, which takes no argument, on a driver connection.
func execConn(ctx context.Context, c driver.Conn, query string) error {
	if e, ok := c.(driver.ExecerContext); ok {
		_, err := e.ExecContext(ctx, query, nil)
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
		_, err = e.ExecContext(ctx, nil)
	} else {
		_, err = st.Exec(nil) //lint:ignore SA1019 the driver's only way
	}
	return err
}
