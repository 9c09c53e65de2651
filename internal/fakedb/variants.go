package fakedb

import (
	"database/sql/driver"
	"fmt"
	"reflect"
	"strings"
)

// ConnIface is a set of optional driver.Conn interfaces.
type ConnIface uint16

// Optional interfaces of a connection.
const (
	ConnExecerContext ConnIface = 1 << iota
	ConnExecer
	ConnQueryerContext
	ConnQueryer
	ConnPinger
	ConnSessionResetter
	ConnValidator
	ConnNamedValueChecker
	ConnBeginTx
	ConnPrepareContext
	ConnAll ConnIface = 1<<iota - 1
)

// StmtIface is a set of optional driver.Stmt interfaces.
type StmtIface uint8

// Optional interfaces of a statement.
const (
	StmtExecContext StmtIface = 1 << iota
	StmtQueryContext
	StmtNamedValueChecker
	StmtColumnConverter
	StmtAll StmtIface = 1<<iota - 1
)

// RowsIface is a set of optional driver.Rows interfaces.
type RowsIface uint8

// Optional interfaces of rows: RowsNextResultSet and the five
// RowsColumnType* interfaces.
const (
	RowsNextResultSet RowsIface = 1 << iota
	RowsScanType
	RowsDatabaseTypeName
	RowsLength
	RowsNullable
	RowsPrecisionScale
	RowsAll RowsIface = 1<<iota - 1
)

var (
	connIfaceNames = []string{"ExecerContext", "Execer", "QueryerContext", "Queryer", "Pinger",
		"SessionResetter", "Validator", "NamedValueChecker", "ConnBeginTx", "ConnPrepareContext"}
	stmtIfaceNames = []string{"StmtExecContext", "StmtQueryContext", "NamedValueChecker", "ColumnConverter"}
	rowsIfaceNames = []string{"RowsNextResultSet", "RowsColumnTypeScanType", "RowsColumnTypeDatabaseTypeName",
		"RowsColumnTypeLength", "RowsColumnTypeNullable", "RowsColumnTypePrecisionScale"}
)

func maskString(m uint, names []string) string {
	switch m {
	case 0:
		return "none"
	case 1<<len(names) - 1:
		return "all"
	}
	var b strings.Builder
	for i, n := range names {
		if m&(1<<i) != 0 {
			if b.Len() > 0 {
				b.WriteByte('|')
			}
			b.WriteString(n)
		}
	}
	return b.String()
}

func (m ConnIface) String() string { return maskString(uint(m), connIfaceNames) }
func (m StmtIface) String() string { return maskString(uint(m), stmtIfaceNames) }
func (m RowsIface) String() string { return maskString(uint(m), rowsIfaceNames) }

// ConnIfacesOf reports which optional connection interfaces v implements.
func ConnIfacesOf(v any) ConnIface {
	var m ConnIface
	for i, ok := range []bool{
		is[driver.ExecerContext](v), is[driver.Execer](v), is[driver.QueryerContext](v), is[driver.Queryer](v),
		is[driver.Pinger](v), is[driver.SessionResetter](v), is[driver.Validator](v),
		is[driver.NamedValueChecker](v), is[driver.ConnBeginTx](v), is[driver.ConnPrepareContext](v),
	} {
		m |= mask[ConnIface](i, ok)
	}
	return m
}

// StmtIfacesOf reports which optional statement interfaces v implements.
func StmtIfacesOf(v any) StmtIface {
	var m StmtIface
	for i, ok := range []bool{
		is[driver.StmtExecContext](v), is[driver.StmtQueryContext](v),
		is[driver.NamedValueChecker](v), is[driver.ColumnConverter](v),
	} {
		m |= mask[StmtIface](i, ok)
	}
	return m
}

// RowsIfacesOf reports which optional rows interfaces v implements.
func RowsIfacesOf(v any) RowsIface {
	var m RowsIface
	for i, ok := range []bool{
		is[driver.RowsNextResultSet](v), is[driver.RowsColumnTypeScanType](v),
		is[driver.RowsColumnTypeDatabaseTypeName](v), is[driver.RowsColumnTypeLength](v),
		is[driver.RowsColumnTypeNullable](v), is[driver.RowsColumnTypePrecisionScale](v),
	} {
		m |= mask[RowsIface](i, ok)
	}
	return m
}

func is[I any](v any) bool {
	_, ok := v.(I)
	return ok
}

func mask[M ~uint8 | ~uint16](bit int, on bool) M {
	if on {
		return 1 << bit
	}
	return 0
}

// ConnVariants returns the masks Connector.Conn may take.
func ConnVariants() []ConnIface { return masks(connVariants) }

// StmtVariants returns the masks Connector.Stmt may take.
func StmtVariants() []StmtIface { return masks(stmtVariants) }

// RowsVariants returns the masks Connector.Rows may take.
func RowsVariants() []RowsIface { return masks(rowsVariants) }

// A variant offers the interfaces of mask m: wrap(x) is x itself for all
// of them, else a struct embedding x once per interface it keeps.
type variant[M any, T any, V any] struct {
	m    M
	wrap func(T) V
}

func masks[M, T, V any](vs []variant[M, T, V]) []M {
	ms := make([]M, len(vs))
	for i, v := range vs {
		ms[i] = v.m
	}
	return ms
}

// wrap returns x in the variant of mask m; it panics if there is none.
func wrap[M comparable, T, V any](field string, vs []variant[M, T, V], m M, x T) V {
	for _, v := range vs {
		if v.m == m {
			return v.wrap(x)
		}
	}
	supported := make([]string, len(vs))
	for i, v := range vs {
		supported[i] = fmt.Sprint(v.m)
	}
	panic(fmt.Sprintf("fakedb: Connector.%s = %v is not a variant; the supported ones: %s",
		field, m, strings.Join(supported, "; ")))
}

// Each kind's variants are all, none, then a pairwise covering array: each
// interface is on in two of the rows, no two interfaces in the same two, so
// every two are on and off in all four ways. Every interface is in a row:
// the rows' struct literals check at compile time that Conn, Stmt and Rows
// implement each one.

// connVariants end with the masks tests name. Pairs the gate's code lets
// interact: ExecerContext×Execer, QueryerContext×Queryer, each of them
// ×ConnPrepareContext (the fallback) and ×NamedValueChecker,
// Pinger×SessionResetter (session check), SessionResetter×Validator
// (keepConnOnRollback).
var connVariants = []variant[ConnIface, *Conn, driver.Conn]{
	{ConnAll, func(c *Conn) driver.Conn { return c }},
	{0, func(c *Conn) driver.Conn { return &struct{ driver.Conn }{c} }},
	{ConnExecerContext | ConnQueryerContext | ConnBeginTx | ConnPrepareContext, func(c *Conn) driver.Conn {
		return &struct {
			driver.Conn
			driver.ExecerContext
			driver.QueryerContext
			driver.ConnBeginTx
			driver.ConnPrepareContext
		}{c, c, c, c, c}
	}},
	{ConnExecerContext | ConnExecer | ConnQueryer | ConnPinger, func(c *Conn) driver.Conn {
		return &struct {
			driver.Conn
			driver.ExecerContext
			driver.Execer
			driver.Queryer
			driver.Pinger
		}{c, c, c, c, c}
	}},
	{ConnExecer | ConnQueryerContext | ConnSessionResetter | ConnValidator, func(c *Conn) driver.Conn {
		return &struct {
			driver.Conn
			driver.Execer
			driver.QueryerContext
			driver.SessionResetter
			driver.Validator
		}{c, c, c, c, c}
	}},
	{ConnQueryer | ConnSessionResetter | ConnNamedValueChecker | ConnBeginTx, func(c *Conn) driver.Conn {
		return &struct {
			driver.Conn
			driver.Queryer
			driver.SessionResetter
			driver.NamedValueChecker
			driver.ConnBeginTx
		}{c, c, c, c, c}
	}},
	{ConnPinger | ConnValidator | ConnNamedValueChecker | ConnPrepareContext, func(c *Conn) driver.Conn {
		return &struct {
			driver.Conn
			driver.Pinger
			driver.Validator
			driver.NamedValueChecker
			driver.ConnPrepareContext
		}{c, c, c, c, c}
	}},
	{ConnAll &^ (ConnExecerContext | ConnExecer), func(c *Conn) driver.Conn {
		return &struct {
			driver.Conn
			driver.QueryerContext
			driver.Queryer
			sessionChecker
			driver.NamedValueChecker
			driver.ConnBeginTx
			driver.ConnPrepareContext
		}{c, c, c, c, c, c, c}
	}},
	{ConnAll &^ (ConnExecerContext | ConnExecer | ConnQueryerContext | ConnQueryer), func(c *Conn) driver.Conn {
		return &struct {
			driver.Conn
			sessionChecker
			driver.NamedValueChecker
			driver.ConnBeginTx
			driver.ConnPrepareContext
		}{c, c, c, c, c}
	}},
}

// sessionChecker is Pinger, SessionResetter and Validator.
type sessionChecker interface {
	driver.Pinger
	driver.SessionResetter
	driver.Validator
}

// columnConverter is driver.ColumnConverter, whose method an embedded field
// of that name would hide.
type columnConverter interface {
	ColumnConverter(int) driver.ValueConverter
}

// stmtVariants: the gate lets NamedValueChecker×ColumnConverter interact,
// and with the connection's NamedValueChecker, Execers and Queryers.
var stmtVariants = []variant[StmtIface, *Stmt, driver.Stmt]{
	{StmtAll, func(s *Stmt) driver.Stmt { return s }},
	{0, func(s *Stmt) driver.Stmt { return &struct{ driver.Stmt }{s} }},
	{StmtExecContext | StmtNamedValueChecker, func(s *Stmt) driver.Stmt {
		return &struct {
			driver.Stmt
			driver.StmtExecContext
			driver.NamedValueChecker
		}{s, s, s}
	}},
	{StmtExecContext | StmtColumnConverter, func(s *Stmt) driver.Stmt {
		return &struct {
			driver.Stmt
			driver.StmtExecContext
			columnConverter
		}{s, s, s}
	}},
	{StmtQueryContext | StmtNamedValueChecker, func(s *Stmt) driver.Stmt {
		return &struct {
			driver.Stmt
			driver.StmtQueryContext
			driver.NamedValueChecker
		}{s, s, s}
	}},
	{StmtQueryContext | StmtColumnConverter, func(s *Stmt) driver.Stmt {
		return &struct {
			driver.Stmt
			driver.StmtQueryContext
			columnConverter
		}{s, s, s}
	}},
}

// The optional rows interfaces without the driver.Rows several of them
// embed, which a variant embeds once.
type (
	nextResultSet interface {
		HasNextResultSet() bool
		NextResultSet() error
	}
	scanType        interface{ ColumnTypeScanType(int) reflect.Type }
	typeName        interface{ ColumnTypeDatabaseTypeName(int) string }
	length          interface{ ColumnTypeLength(int) (int64, bool) }
	nullable        interface{ ColumnTypeNullable(int) (bool, bool) }
	precisionScaler interface {
		ColumnTypePrecisionScale(int) (int64, int64, bool)
	}
)

// rowsVariants: the gate forwards each rows interface on its own.
var rowsVariants = []variant[RowsIface, *Rows, driver.Rows]{
	{RowsAll, func(r *Rows) driver.Rows { return r }},
	{0, func(r *Rows) driver.Rows { return &struct{ driver.Rows }{r} }},
	{RowsNextResultSet | RowsDatabaseTypeName | RowsNullable, func(r *Rows) driver.Rows {
		return &struct {
			driver.Rows
			nextResultSet
			typeName
			nullable
		}{r, r, r, r}
	}},
	{RowsNextResultSet | RowsLength | RowsPrecisionScale, func(r *Rows) driver.Rows {
		return &struct {
			driver.Rows
			nextResultSet
			length
			precisionScaler
		}{r, r, r, r}
	}},
	{RowsScanType | RowsDatabaseTypeName | RowsPrecisionScale, func(r *Rows) driver.Rows {
		return &struct {
			driver.Rows
			scanType
			typeName
			precisionScaler
		}{r, r, r, r}
	}},
	{RowsScanType | RowsLength | RowsNullable, func(r *Rows) driver.Rows {
		return &struct {
			driver.Rows
			scanType
			length
			nullable
		}{r, r, r, r}
	}},
}
