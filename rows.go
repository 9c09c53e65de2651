package bulkhead

import (
	"database/sql/driver"
	"io"
	"reflect"
)

// rows holds an autocommit query's permits until Close returns; it offers
// every optional rows interface, answering as database/sql does without.
type rows struct {
	c     *conn
	inner driver.Rows
	stmt  driver.Stmt // the statement of database/sql's fallback, closed after the rows; or nil
	p     permit
	open  bool // its permits are to be released
}

func (r *rows) Columns() []string              { return r.inner.Columns() }
func (r *rows) Next(dest []driver.Value) error { return r.inner.Next(dest) }

func (r *rows) Close() error {
	returned := false
	defer r.finish(&returned)
	err := r.inner.Close()
	if r.stmt != nil {
		if cerr := r.stmt.Close(); err == nil {
			err = cerr
		}
		r.stmt = nil
	}
	returned = true
	return err
}

// finish is conn.finish for Close, releasing the permits once.
func (r *rows) finish(returned *bool) {
	if !*returned {
		r.c.lose()
	}
	if r.open {
		r.open = false
		r.c.g.release(&r.p)
	}
}

func (r *rows) HasNextResultSet() bool {
	n, ok := r.inner.(driver.RowsNextResultSet)
	return ok && n.HasNextResultSet()
}

func (r *rows) NextResultSet() error {
	if n, ok := r.inner.(driver.RowsNextResultSet); ok {
		return n.NextResultSet()
	}
	return io.EOF
}

func (r *rows) ColumnTypeScanType(i int) reflect.Type {
	if t, ok := r.inner.(driver.RowsColumnTypeScanType); ok {
		return t.ColumnTypeScanType(i)
	}
	return reflect.TypeFor[any]()
}

func (r *rows) ColumnTypeDatabaseTypeName(i int) string {
	if t, ok := r.inner.(driver.RowsColumnTypeDatabaseTypeName); ok {
		return t.ColumnTypeDatabaseTypeName(i)
	}
	return ""
}

func (r *rows) ColumnTypeLength(i int) (int64, bool) {
	if t, ok := r.inner.(driver.RowsColumnTypeLength); ok {
		return t.ColumnTypeLength(i)
	}
	return 0, false
}

func (r *rows) ColumnTypeNullable(i int) (nullable, ok bool) {
	if t, ok := r.inner.(driver.RowsColumnTypeNullable); ok {
		return t.ColumnTypeNullable(i)
	}
	return false, false
}

func (r *rows) ColumnTypePrecisionScale(i int) (precision, scale int64, ok bool) {
	if t, ok := r.inner.(driver.RowsColumnTypePrecisionScale); ok {
		return t.ColumnTypePrecisionScale(i)
	}
	return 0, 0, false
}
