package fakedb

import (
	"database/sql/driver"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
)

// Column is a result column and the metadata the RowsColumnType*
// interfaces report for it (Length, Nullable and PrecisionScale always
// report ok). The default column of the SELECT parser is named "c<i>",
// type "INT8", scan type int64, length 8, not nullable, precision 19,
// scale 0; for a "?" item, type "ANY" and the argument's Go type.
type Column struct {
	Name      string
	TypeName  string
	ScanType  reflect.Type // nil: the type of the first row's value, else any
	Length    int64
	Nullable  bool
	Precision int64
	Scale     int64
}

// ResultSet is one result set of a query.
type ResultSet struct {
	Columns []Column
	Rows    [][]driver.Value
}

// Rows are the rows of a query of the fake driver. They implement every
// optional interface; a query returns them inside a variant that offers
// fewer unless the Connector's Rows is RowsAll.
type Rows struct {
	fc    *Connector
	sets  []ResultSet
	names [][]string // per result set, the column names
	set   int        // current result set
	row   int        // next row of it
}

// rows returns query's rows in the variant of fc.Rows; it panics if that
// is not one of RowsVariants.
func (fc *Connector) rows(query string, args []driver.NamedValue) (driver.Rows, error) {
	var t *template
	if v, ok := fc.defined.Load(query); ok {
		t = v.(*template)
	} else {
		var err error
		if t, err = fc.template(query); err != nil {
			return nil, err
		}
	}
	sets, err := t.fill(args)
	if err != nil {
		return nil, err
	}
	return wrap("Rows", rowsVariants, fc.Rows, &Rows{fc: fc, sets: sets, names: t.names}), nil
}

func (r *Rows) Columns() []string { return r.names[r.set] }

func (r *Rows) Close() error { return r.fc.enter(bg, OpRowsClose, "") }

func (r *Rows) Next(dest []driver.Value) error {
	if err := r.fc.enter(bg, OpRowsNext, ""); err != nil {
		return err
	}
	rs := r.sets[r.set].Rows
	if r.row >= len(rs) {
		return io.EOF
	}
	copy(dest, rs[r.row])
	r.row++
	return nil
}

func (r *Rows) HasNextResultSet() bool { return r.set+1 < len(r.sets) }

func (r *Rows) NextResultSet() error {
	if err := r.fc.enter(bg, OpRowsNextResultSet, ""); err != nil {
		return err
	}
	if !r.HasNextResultSet() {
		return io.EOF
	}
	r.set++
	r.row = 0
	return nil
}

func (r *Rows) column(i int) *Column { return &r.sets[r.set].Columns[i] }

var anyType = reflect.TypeFor[any]()

func (r *Rows) ColumnTypeScanType(i int) reflect.Type {
	if t := r.column(i).ScanType; t != nil {
		return t
	}
	if rs := r.sets[r.set].Rows; len(rs) > 0 && rs[0][i] != nil {
		return reflect.TypeOf(rs[0][i])
	}
	return anyType
}

func (r *Rows) ColumnTypeDatabaseTypeName(i int) string { return r.column(i).TypeName }

func (r *Rows) ColumnTypeLength(i int) (int64, bool) { return r.column(i).Length, true }

func (r *Rows) ColumnTypeNullable(i int) (nullable, ok bool) { return r.column(i).Nullable, true }

func (r *Rows) ColumnTypePrecisionScale(i int) (precision, scale int64, ok bool) {
	c := r.column(i)
	return c.Precision, c.Scale, true
}

// template is a parsed "SELECT x, y; SELECT z" query: per result set, per
// column, an argument index, or -1 for the literal in values.
type template struct {
	sets    []ResultSet
	names   [][]string // per result set, the column names
	argIdx  [][]int    // nil: no argument anywhere
	hasArgs bool
}

func newTemplate(sets []ResultSet, argIdx [][]int) *template {
	t := &template{sets: sets, argIdx: argIdx}
	for _, rs := range sets {
		names := make([]string, len(rs.Columns))
		for i, c := range rs.Columns {
			names[i] = c.Name
		}
		t.names = append(t.names, names)
	}
	for _, idx := range argIdx {
		for _, a := range idx {
			t.hasArgs = t.hasArgs || a >= 0
		}
	}
	return t
}

var int64Type = reflect.TypeFor[int64]()

func (fc *Connector) template(query string) (*template, error) {
	if v, ok := fc.parsed.Load(query); ok {
		return v.(*template), nil
	}
	t, err := parse(query)
	if err != nil {
		return nil, err
	}
	fc.parsed.Store(query, t)
	return t, nil
}

func parse(query string) (*template, error) {
	var sets []ResultSet
	var argIdx [][]int
	arg := 0
	for _, stmt := range strings.Split(query, ";") {
		stmt = strings.TrimSpace(stmt)
		if stmt == "" {
			continue
		}
		rest, ok := cutPrefixFold(stmt, "SELECT ")
		if !ok {
			return nil, fmt.Errorf("fakedb: query %q: want SELECT followed by integers or ?, or a query given to Define", query)
		}
		var rs ResultSet
		var idx []int
		row := []driver.Value{}
		for i, item := range strings.Split(rest, ",") {
			item = strings.TrimSpace(item)
			col := Column{Name: "c" + strconv.Itoa(i+1), TypeName: "INT8", ScanType: int64Type, Length: 8, Precision: 19}
			if item == "?" {
				col.TypeName, col.ScanType = "ANY", nil
				idx = append(idx, arg)
				arg++
				row = append(row, nil)
			} else {
				n, err := strconv.ParseInt(item, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("fakedb: query %q: item %q: want an integer or ?", query, item)
				}
				idx = append(idx, -1)
				row = append(row, n)
			}
			rs.Columns = append(rs.Columns, col)
		}
		rs.Rows = [][]driver.Value{row}
		sets = append(sets, rs)
		argIdx = append(argIdx, idx)
	}
	if len(sets) == 0 {
		return nil, fmt.Errorf("fakedb: query %q is empty", query)
	}
	return newTemplate(sets, argIdx), nil
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix) {
		return s[len(prefix):], true
	}
	return s, false
}

// fill returns the result sets with the arguments in place.
func (t *template) fill(args []driver.NamedValue) ([]ResultSet, error) {
	if !t.hasArgs {
		return t.sets, nil
	}
	sets := make([]ResultSet, len(t.sets))
	for s, rs := range t.sets {
		row := make([]driver.Value, len(rs.Columns))
		copy(row, rs.Rows[0])
		for c, a := range t.argIdx[s] {
			if a < 0 {
				continue
			}
			if a >= len(args) {
				return nil, fmt.Errorf("fakedb: %d arguments, want at least %d", len(args), a+1)
			}
			row[c] = args[a].Value
		}
		sets[s] = ResultSet{Columns: rs.Columns, Rows: [][]driver.Value{row}}
	}
	return sets, nil
}
