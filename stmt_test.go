//go:build go1.25

package bulkhead_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/gatetest"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// lazyDriver's statements work NumInput out on their connection when first
// asked, as ncruces/go-sqlite3's do, touching its state unsynchronised.
type lazyDriver struct{ numInputs, prepares atomic.Int64 }

func (d *lazyDriver) Connect(context.Context) (driver.Conn, error) { return &lazyConn{d: d}, nil }
func (d *lazyDriver) Driver() driver.Driver                        { return nil }

type lazyConn struct {
	d     *lazyDriver
	state int // touched by every call on the connection and its statements
}

func (c *lazyConn) Prepare(query string) (driver.Stmt, error) {
	c.d.prepares.Add(1)
	c.state++
	return &lazyStmt{c: c, inputs: -2}, nil
}
func (c *lazyConn) Close() error              { return nil }
func (c *lazyConn) Begin() (driver.Tx, error) { return nil, errors.New("lazyDriver: no transactions") }

type lazyStmt struct {
	c      *lazyConn
	inputs int
}

func (s *lazyStmt) NumInput() int {
	if s.inputs == -2 {
		s.c.d.numInputs.Add(1)
		s.c.state++ // the driver asks its connection
		s.inputs = 1
	}
	return s.inputs
}
func (s *lazyStmt) Close() error { return nil }
func (s *lazyStmt) Exec([]driver.Value) (driver.Result, error) {
	s.c.state++
	return driver.RowsAffected(1), nil
}
func (s *lazyStmt) Query([]driver.Value) (driver.Rows, error) {
	s.c.state++
	return &lazyRows{}, nil
}

type lazyRows struct{}

func (*lazyRows) Columns() []string         { return nil }
func (*lazyRows) Close() error              { return nil }
func (*lazyRows) Next([]driver.Value) error { return io.EOF }

// Asked from another goroutine it would race with whoever uses that
// connection: a data race under -race, a crash for a WebAssembly SQLite.
func TestNumInputIsAskedOnlyWhileTheConnectionThatPreparedItIsHeld(t *testing.T) {
	d := &lazyDriver{}
	_, db := gatetest.Open(t, d, bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 64, QueueWait: time.Minute})
	ctx := context.Background()
	st := testkit.Prepare(t, ctx, db, "UPDATE t SET n = n + 1 WHERE id = ?")
	defer st.Close()

	const workers, each = 8, 50
	// database/sql prepares the statement on each *sql.Conn, concurrently.
	inParallel(t, workers, each, func() error {
		conn, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		_, err = conn.ExecContext(ctx, "UPDATE t SET n = n + 1 WHERE id = ?", 1)
		if err == nil {
			_, err = st.ExecContext(ctx, 1)
		}
		if cerr := conn.Close(); err == nil {
			err = cerr
		}
		return err
	})
	// At most once per driver statement.
	if n, p := d.numInputs.Load(), d.prepares.Load(); n < 1 || n > p {
		t.Fatalf("the driver worked NumInput out %d times for %d statements prepared, want 1 to %d", n, p, p)
	}
}
