// Package fakedb is an in-process database/sql driver for tests, examples
// and benchmarks of bulkhead. It runs no SQL: a query's rows come from a
// tiny parser or from results defined by the test.
//
// # Opening
//
//	fc := fakedb.New()                     // every optional interface implemented
//	fc.Conn = fakedb.ConnExecer | ...      // or choose them (set before first use)
//	db := sql.OpenDB(fc)                   // or wrap it: bulkhead.New(fc, policy)
//
// Connector.Conn, Connector.Stmt and Connector.Rows select which optional
// driver interfaces the connections, statements and rows implement, any
// subset: ConnExecerContext, ConnExecer, ConnQueryerContext, ConnQueryer,
// ConnPinger, ConnSessionResetter, ConnValidator, ConnNamedValueChecker,
// ConnBeginTx, ConnPrepareContext; StmtExecContext, StmtQueryContext,
// StmtNamedValueChecker, StmtColumnConverter; RowsNextResultSet,
// RowsScanType, RowsDatabaseTypeName, RowsLength, RowsNullable,
// RowsPrecisionScale. ConnIfacesOf, StmtIfacesOf and RowsIfacesOf report
// which of them any value implements (a wrapper's, for instance).
//
// # Results
//
// Exec succeeds with one row affected. Query returns, for a query defined
// with Define, its result sets; otherwise it parses the query as
// "SELECT x, y, ...[; SELECT ...]": each x is an integer literal or "?" (the
// next argument), each SELECT one result set of one row. "SELECT 42" gives
// 42 in a column named "c1" (see Column for its metadata). Anything else is
// an error.
//
// # Observing and steering
//
// Every driver call is an Op. When a call enters the driver it is counted
// (Count), then passed to the hook (SetHook), then held at the op's barrier
// (Block), then given the op's injected fault (FailNext, PanicNext), in
// that order; a non-nil error from any of them is what the call returns
// (IsValid reports false instead). Calls with a context stop waiting at a
// barrier when it ends and return its error. Open and MaxOpen count
// physical connections; Conns lists the open ones; Connector.ConnOf finds
// the *Conn behind a value returned by Connect.
//
// All methods are safe for concurrent use. With no hook, barrier or fault
// set, Exec, Query, BeginTx, Commit and Rollback cost a few atomic
// operations; Exec and BeginTx allocate nothing, Query allocates its rows.
package fakedb

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

//go:generate go run gen.go

// Op is a kind of driver call.
type Op uint8

// The driver calls. The legacy and context forms of a call are one Op.
const (
	OpConnect           Op = iota // Connector.Connect, Driver.Open
	OpConnClose                   // Conn.Close
	OpConnectorClose              // Connector.Close (io.Closer, called by db.Close through a wrapper)
	OpPrepare                     // Conn.Prepare, PrepareContext
	OpBegin                       // Conn.Begin, BeginTx
	OpCommit                      // Tx.Commit
	OpRollback                    // Tx.Rollback
	OpExec                        // Conn.Exec, ExecContext
	OpQuery                       // Conn.Query, QueryContext
	OpPing                        // Pinger.Ping
	OpResetSession                // SessionResetter.ResetSession
	OpIsValid                     // Validator.IsValid
	OpCheckNamedValue             // NamedValueChecker.CheckNamedValue (Conn and Stmt)
	OpStmtExec                    // Stmt.Exec, ExecContext
	OpStmtQuery                   // Stmt.Query, QueryContext
	OpStmtClose                   // Stmt.Close
	OpRowsNext                    // Rows.Next
	OpRowsNextResultSet           // Rows.NextResultSet
	OpRowsClose                   // Rows.Close
	numOps
)

var opNames = [numOps]string{
	"Connect", "ConnClose", "ConnectorClose", "Prepare", "Begin", "Commit", "Rollback",
	"Exec", "Query", "Ping", "ResetSession", "IsValid", "CheckNamedValue",
	"StmtExec", "StmtQuery", "StmtClose", "RowsNext", "RowsNextResultSet", "RowsClose",
}

func (op Op) String() string {
	if op < numOps {
		return opNames[op]
	}
	return "Op(" + strconv.Itoa(int(op)) + ")"
}

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
	set := func(ok bool, f ConnIface) {
		if ok {
			m |= f
		}
	}
	_, ok := v.(driver.ExecerContext)
	set(ok, ConnExecerContext)
	_, ok = v.(driver.Execer) //nolint:staticcheck // the legacy interface is what is tested
	set(ok, ConnExecer)
	_, ok = v.(driver.QueryerContext)
	set(ok, ConnQueryerContext)
	_, ok = v.(driver.Queryer) //nolint:staticcheck // the legacy interface is what is tested
	set(ok, ConnQueryer)
	_, ok = v.(driver.Pinger)
	set(ok, ConnPinger)
	_, ok = v.(driver.SessionResetter)
	set(ok, ConnSessionResetter)
	_, ok = v.(driver.Validator)
	set(ok, ConnValidator)
	_, ok = v.(driver.NamedValueChecker)
	set(ok, ConnNamedValueChecker)
	_, ok = v.(driver.ConnBeginTx)
	set(ok, ConnBeginTx)
	_, ok = v.(driver.ConnPrepareContext)
	set(ok, ConnPrepareContext)
	return m
}

// StmtIfacesOf reports which optional statement interfaces v implements.
func StmtIfacesOf(v any) StmtIface {
	var m StmtIface
	if _, ok := v.(driver.StmtExecContext); ok {
		m |= StmtExecContext
	}
	if _, ok := v.(driver.StmtQueryContext); ok {
		m |= StmtQueryContext
	}
	if _, ok := v.(driver.NamedValueChecker); ok {
		m |= StmtNamedValueChecker
	}
	if _, ok := v.(driver.ColumnConverter); ok { //nolint:staticcheck // the legacy interface is what is tested
		m |= StmtColumnConverter
	}
	return m
}

// RowsIfacesOf reports which optional rows interfaces v implements.
func RowsIfacesOf(v any) RowsIface {
	var m RowsIface
	if _, ok := v.(driver.RowsNextResultSet); ok {
		m |= RowsNextResultSet
	}
	if _, ok := v.(driver.RowsColumnTypeScanType); ok {
		m |= RowsScanType
	}
	if _, ok := v.(driver.RowsColumnTypeDatabaseTypeName); ok {
		m |= RowsDatabaseTypeName
	}
	if _, ok := v.(driver.RowsColumnTypeLength); ok {
		m |= RowsLength
	}
	if _, ok := v.(driver.RowsColumnTypeNullable); ok {
		m |= RowsNullable
	}
	if _, ok := v.(driver.RowsColumnTypePrecisionScale); ok {
		m |= RowsPrecisionScale
	}
	return m
}

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

// Hook is called on every driver call as it enters the driver, on the
// calling goroutine (database/sql's own for rollbacks and rows closes it
// makes). ctx is the call's context, context.Background() for calls
// without one; query is the SQL text for Prepare, Exec, Query and the
// statement calls, else "". A non-nil error is returned by the call; the
// hook may also block or panic.
type Hook func(ctx context.Context, op Op, query string) error

// Connector is the fake driver's driver.Connector and io.Closer.
// Configure its exported fields before the first Connect; they are read
// without locks afterwards.
type Connector struct {
	Conn ConnIface // optional interfaces of each connection
	Stmt StmtIface // of each prepared statement
	Rows RowsIface // of each query's rows

	defined sync.Map // query string -> *template, from Define
	parsed  sync.Map // query string -> *template, from the SELECT parser

	hook     atomic.Pointer[Hook]
	barriers [numOps]atomic.Pointer[Barrier]
	faults   [numOps]atomic.Pointer[fault]
	counts   [numOps]atomic.Int64

	nextID  atomic.Int64
	mu      sync.Mutex
	conns   map[*Conn]driver.Conn // open connections, as returned by Connect
	maxOpen int
}

var (
	_ driver.Connector = (*Connector)(nil)
	_ io.Closer        = (*Connector)(nil)
)

// New returns a Connector whose connections, statements and rows
// implement every optional interface, like a modern driver.
func New() *Connector {
	return &Connector{Conn: ConnAll, Stmt: StmtAll, Rows: RowsAll}
}

// Define makes query return the given result sets (the first one only,
// unless the rows implement RowsNextResultSet). It may be called at any
// time.
func (fc *Connector) Define(query string, sets ...ResultSet) {
	fc.defined.Store(query, newTemplate(sets, nil))
}

// SetHook sets the hook called on every driver call; nil removes it.
func (fc *Connector) SetHook(h Hook) {
	if h == nil {
		fc.hook.Store(nil)
		return
	}
	fc.hook.Store(&h)
}

// Count returns how many calls of op entered the driver, failed ones
// included.
func (fc *Connector) Count(op Op) int64 { return fc.counts[op].Load() }

// Open returns how many connections are open: connected and not closed.
func (fc *Connector) Open() int {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return len(fc.conns)
}

// MaxOpen returns the most connections that were open at once.
func (fc *Connector) MaxOpen() int {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	return fc.maxOpen
}

// Conns returns the open connections, as Connect returned them.
func (fc *Connector) Conns() []driver.Conn {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	cs := make([]driver.Conn, 0, len(fc.conns))
	for _, c := range fc.conns {
		cs = append(cs, c)
	}
	return cs
}

// ConnOf returns the open connection whose value Connect returned as v,
// or nil if v is no such value (a wrapper of it, for instance).
func (fc *Connector) ConnOf(v any) *Conn {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	for c, dc := range fc.conns {
		if v == any(dc) {
			return c
		}
	}
	return nil
}

// FailNext makes the next n calls of op return err (IsValid: report
// false). It replaces an earlier FailNext or PanicNext of op.
func (fc *Connector) FailNext(op Op, n int, err error) {
	f := &fault{err: err}
	f.left.Store(int64(n))
	fc.faults[op].Store(f)
}

// PanicNext makes the next n calls of op panic with v. It replaces an
// earlier FailNext or PanicNext of op.
func (fc *Connector) PanicNext(op Op, n int, v any) {
	if v == nil {
		v = "fakedb: injected panic in " + op.String()
	}
	f := &fault{panicV: v}
	f.left.Store(int64(n))
	fc.faults[op].Store(f)
}

type fault struct {
	left   atomic.Int64
	err    error
	panicV any
}

// Barrier holds the calls of one Op inside the driver until released.
type Barrier struct {
	fc      *Connector
	op      Op
	release chan struct{}

	mu      sync.Mutex
	entered int
	inside  int
	changed chan struct{} // closed and replaced when entered or inside changes
}

// Block raises a barrier for op: from now until Release, every call of op
// waits inside the driver (after the hook, before any fault), or until its
// context ends. It replaces an earlier barrier of op, which stays raised
// for the calls it holds until its own Release.
func (fc *Connector) Block(op Op) *Barrier {
	b := &Barrier{fc: fc, op: op, release: make(chan struct{}), changed: make(chan struct{})}
	fc.barriers[op].Store(b)
	return b
}

// Wait returns once n calls in all have reached the barrier.
func (b *Barrier) Wait(n int) {
	for {
		b.mu.Lock()
		if b.entered >= n {
			b.mu.Unlock()
			return
		}
		ch := b.changed
		b.mu.Unlock()
		<-ch
	}
}

// Entered returns how many calls have reached the barrier.
func (b *Barrier) Entered() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.entered
}

// Inside returns how many calls are held at the barrier now.
func (b *Barrier) Inside() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inside
}

// Release lowers the barrier: the calls it holds go on, later calls pass.
// Calling it again does nothing.
func (b *Barrier) Release() {
	b.fc.barriers[b.op].CompareAndSwap(b, nil)
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-b.release:
	default:
		close(b.release)
	}
}

func (b *Barrier) add(entered, inside int) {
	b.mu.Lock()
	b.entered += entered
	b.inside += inside
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

func (b *Barrier) hold(ctx context.Context) error {
	b.add(1, 1)
	defer b.add(0, -1)
	select {
	case <-b.release:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// enter counts a call and applies the hook, barrier and fault of op.
func (fc *Connector) enter(ctx context.Context, op Op, query string) error {
	fc.counts[op].Add(1)
	if h := fc.hook.Load(); h != nil {
		if err := (*h)(ctx, op, query); err != nil {
			return err
		}
	}
	if b := fc.barriers[op].Load(); b != nil {
		if err := b.hold(ctx); err != nil {
			return err
		}
	}
	if f := fc.faults[op].Load(); f != nil && f.left.Add(-1) >= 0 {
		if f.panicV != nil {
			panic(f.panicV)
		}
		return f.err
	}
	return nil
}

var bg = context.Background()

// Connect opens a connection implementing the optional interfaces in
// fc.Conn.
func (fc *Connector) Connect(ctx context.Context) (driver.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := fc.enter(ctx, OpConnect, ""); err != nil {
		return nil, err
	}
	c := &Conn{fc: fc, id: fc.nextID.Add(1)}
	c.tx.c = c
	dc := newConnValue(c, fc.Conn&ConnAll)
	fc.mu.Lock()
	if fc.conns == nil {
		fc.conns = make(map[*Conn]driver.Conn)
	}
	fc.conns[c] = dc
	fc.maxOpen = max(fc.maxOpen, len(fc.conns))
	fc.mu.Unlock()
	return dc, nil
}

// Driver returns a driver whose Open(name) is Connect, name ignored.
func (fc *Connector) Driver() driver.Driver { return fakeDriver{fc} }

// Close counts an OpConnectorClose and returns its hook's or fault's error.
func (fc *Connector) Close() error { return fc.enter(bg, OpConnectorClose, "") }

type fakeDriver struct{ fc *Connector }

func (d fakeDriver) Open(string) (driver.Conn, error) { return d.fc.Connect(bg) }

// Conn is a connection of the fake driver. Connect returns it converted
// to a generated type with the optional interfaces chosen; see ConnOf.
type Conn struct {
	fc   *Connector
	id   int64
	tx   Tx
	inTx bool
}

// ID numbers the connections of a Connector from 1 in Connect order.
func (c *Conn) ID() int64 { return c.id }

//go:noinline
func (c *Conn) prepare(ctx context.Context, query string) (driver.Stmt, error) {
	if err := c.fc.enter(ctx, OpPrepare, query); err != nil {
		return nil, err
	}
	s := &Stmt{c: c, sql: query}
	return newStmtValue(s, c.fc.Stmt&StmtAll), nil
}

//go:noinline
func (c *Conn) close() error {
	defer func() {
		c.fc.mu.Lock()
		delete(c.fc.conns, c)
		c.fc.mu.Unlock()
	}()
	return c.fc.enter(bg, OpConnClose, "")
}

var errInTx = errors.New("fakedb: begin on a connection already in a transaction")

//go:noinline
func (c *Conn) begin(ctx context.Context) (driver.Tx, error) {
	if err := c.fc.enter(ctx, OpBegin, ""); err != nil {
		return nil, err
	}
	if c.inTx {
		return nil, errInTx
	}
	c.inTx = true
	return &c.tx, nil
}

// InTx reports whether a transaction is open on the connection. Call it
// only while database/sql does not use the connection (inside Raw).
func (c *Conn) InTx() bool { return c.inTx }

var result driver.Result = driver.RowsAffected(1)

//go:noinline
func (c *Conn) exec(ctx context.Context, query string) (driver.Result, error) {
	if err := c.fc.enter(ctx, OpExec, query); err != nil {
		return nil, err
	}
	return result, nil
}

//go:noinline
func (c *Conn) query(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := c.fc.enter(ctx, OpQuery, query); err != nil {
		return nil, err
	}
	return c.fc.rows(query, args)
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

// Stmt is a prepared statement of the fake driver, converted to a
// generated type with the optional interfaces chosen.
type Stmt struct {
	c   *Conn
	sql string
}

//go:noinline
func (s *Stmt) close() error { return s.c.fc.enter(bg, OpStmtClose, s.sql) }

//go:noinline
func (s *Stmt) exec(ctx context.Context) (driver.Result, error) {
	if err := s.c.fc.enter(ctx, OpStmtExec, s.sql); err != nil {
		return nil, err
	}
	return result, nil
}

//go:noinline
func (s *Stmt) query(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	if err := s.c.fc.enter(ctx, OpStmtQuery, s.sql); err != nil {
		return nil, err
	}
	return s.c.fc.rows(s.sql, args)
}

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

// Rows are the rows of a query of the fake driver, converted to a
// generated type with the optional interfaces chosen.
type Rows struct {
	fc    *Connector
	sets  []ResultSet
	names [][]string // per result set, the column names
	set   int        // current result set
	row   int        // next row of it
}

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
	r := &Rows{fc: fc, sets: sets, names: t.names}
	return newRowsValue(r, fc.Rows&RowsAll), nil
}

//go:noinline
func (r *Rows) columns() []string {
	return r.names[r.set]
}

//go:noinline
func (r *Rows) close() error { return r.fc.enter(bg, OpRowsClose, "") }

//go:noinline
func (r *Rows) next(dest []driver.Value) error {
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

//go:noinline
func (r *Rows) hasNextResultSet() bool { return r.set+1 < len(r.sets) }

//go:noinline
func (r *Rows) nextResultSet() error {
	if err := r.fc.enter(bg, OpRowsNextResultSet, ""); err != nil {
		return err
	}
	if !r.hasNextResultSet() {
		return io.EOF
	}
	r.set++
	r.row = 0
	return nil
}

func (r *Rows) column(i int) *Column { return &r.sets[r.set].Columns[i] }

var anyType = reflect.TypeFor[any]()

//go:noinline
func (r *Rows) scanType(i int) reflect.Type {
	if t := r.column(i).ScanType; t != nil {
		return t
	}
	if rs := r.sets[r.set].Rows; len(rs) > 0 && rs[0][i] != nil {
		return reflect.TypeOf(rs[0][i])
	}
	return anyType
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

// The methods of the generated types (fakedb_gen.go) call these.

//go:noinline
func (c *Conn) ping(ctx context.Context) error { return c.fc.enter(ctx, OpPing, "") }

//go:noinline
func (c *Conn) resetSession(ctx context.Context) error { return c.fc.enter(ctx, OpResetSession, "") }

//go:noinline
func (c *Conn) isValid() bool { return c.fc.enter(bg, OpIsValid, "") == nil }

// checkNamedValue accepts every value, as pgx does: arguments of any Go
// type reach the driver.
//
//go:noinline
func (c *Conn) checkNamedValue() error { return c.fc.enter(bg, OpCheckNamedValue, "") }

//go:noinline
func (s *Stmt) checkNamedValue() error { return s.c.fc.enter(bg, OpCheckNamedValue, s.sql) }

//go:noinline
func (r *Rows) databaseTypeName(i int) string { return r.column(i).TypeName }

//go:noinline
func (r *Rows) length(i int) (int64, bool) { return r.column(i).Length, true }

//go:noinline
func (r *Rows) nullable(i int) (bool, bool) { return r.column(i).Nullable, true }

//go:noinline
func (r *Rows) precisionScale(i int) (int64, int64, bool) {
	c := r.column(i)
	return c.Precision, c.Scale, true
}
