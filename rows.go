package bulkhead

import "database/sql/driver"

// rows holds an autocommit query's permits until Close returns.
// database/sql closes rows itself at the end of Next, in Row.Scan, and from
// its own goroutine when the query's context ends.
type rows struct {
	c     *conn
	inner driver.Rows
	stmt  driver.Stmt // the ErrSkip fallback's statement, closed after the rows; or nil
	p     permit
	held  bool // p is to be released
}

var _ driver.Rows = (*rows)(nil)

func (r *rows) Columns() []string              { return r.inner.Columns() }
func (r *rows) Next(dest []driver.Value) error { return r.inner.Next(dest) }

func (r *rows) Close() error {
	defer func() {
		if r.held {
			r.held = false
			r.c.g.release(&r.p)
		}
	}()
	_, err := guarded(r.c, func() (struct{}, error) { return struct{}{}, r.inner.Close() })
	if r.stmt != nil {
		if _, cerr := guarded(r.c, func() (struct{}, error) { return struct{}{}, r.stmt.Close() }); err == nil {
			err = cerr
		}
	}
	return err
}
