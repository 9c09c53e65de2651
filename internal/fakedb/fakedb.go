// Package fakedb is an in-process database/sql driver for tests, examples
// and benchmarks of bulkhead. It runs no SQL: a query's rows come from a
// tiny parser or from results defined by the test.
//
// # Opening
//
//	fc := fakedb.New()   // every optional interface implemented
//	fc.Conn = 0          // or another of ConnVariants() (set before first use)
//	db := sql.OpenDB(fc) // or wrap it: bulkhead.New(fc, policy)
//
// Connector.Conn, Connector.Stmt and Connector.Rows select which optional
// driver interfaces the connections, statements and rows implement: one of
// the masks ConnVariants, StmtVariants and RowsVariants return, which take
// every two interfaces of a kind on and off in all four ways. Another mask
// panics when it is first used. ConnIfacesOf, StmtIfacesOf and RowsIfacesOf
// report which interfaces any value implements (a wrapper's, for instance).
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
	"io"
	"strconv"
	"sync"
	"sync/atomic"
)

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
	Conn ConnIface // optional interfaces of each connection: one of ConnVariants
	Stmt StmtIface // of each prepared statement: one of StmtVariants
	Rows RowsIface // of each query's rows: one of RowsVariants

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
// fc.Conn. It panics if fc.Conn is not one of ConnVariants.
func (fc *Connector) Connect(ctx context.Context) (driver.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := fc.enter(ctx, OpConnect, ""); err != nil {
		return nil, err
	}
	c := &Conn{fc: fc, id: fc.nextID.Add(1)}
	c.tx.c = c
	dc := wrap("Conn", connVariants, fc.Conn, c)
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
