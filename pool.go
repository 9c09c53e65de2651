package bulkhead

import (
	"context"
	"database/sql/driver"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The server connections. database/sql's pool holds the gate's logical
// connections (conn.go). A logical connection holds a server connection
// (a session) from the moment an operation on it holds its permits, or a
// Ping, a Prepare or Raw needs one. When database/sql takes it back, it
// keeps the session parked: its next operation takes it back with one
// compare-and-swap, once it holds its permits, and anyone who needs a
// session and finds none idle takes a parked one the same way, under the
// pool's lock; so a connection that waits or is refused holds none. The
// idle stack holds the sessions nobody parks: a dial whose caller was
// served meanwhile, a session whose logical connection database/sql did
// not keep.
//
// Two rules keep database/sql's settings and counts true of the server
// connections: the pool never keeps more sessions than database/sql has
// logical connections (when database/sql closes one, for
// SetMaxIdleConns, SetConnMaxLifetime, SetConnMaxIdleTime or a bad
// connection, its session is closed, or else the coldest idle one), and
// database/sql keeps no more idle logical connections than there are idle
// or parked sessions: a logical connection beyond them is reported
// invalid as database/sql takes it back (leaving its session, if any, to
// the pool), or bad as it hands it out, and database/sql discards it.

// Session states: held by one holder (a logical connection, a dial, the
// pool's idle stack), parked on an idle logical connection, or closed.
const (
	held int32 = iota
	parked
	gone
)

// session is a server connection: a driver connection and its optional
// interfaces, asserted once. It has one holder at a time; its plain
// fields are the holder's, and pass to the next holder through state.
type session struct {
	ci            driver.Conn
	execer        driver.ExecerContext
	queryer       driver.QueryerContext
	legacyExecer  driver.Execer  //lint:ignore SA1019 legacy drivers have nothing else
	legacyQueryer driver.Queryer //lint:ignore SA1019 legacy drivers have nothing else
	preparer      driver.ConnPrepareContext
	beginner      driver.ConnBeginTx
	pinger        driver.Pinger
	resetter      driver.SessionResetter
	validator     driver.Validator
	checker       driver.NamedValueChecker

	dirty   bool                   // used since the driver last reset it
	inited  bool                   // WithConnInit's function ran on it
	checked uint64                 // the pool's epoch when it was last known alive
	stmts   map[*query]driver.Stmt // statements prepared on it
	pending []*query               // statements to close before its next use; under pool.mu
	closing atomic.Bool            // pending is not empty
	state   atomic.Int32           // held, parked or gone
}

func newSession(ci driver.Conn) *session {
	s := &session{ci: ci}
	s.execer, _ = ci.(driver.ExecerContext)
	s.queryer, _ = ci.(driver.QueryerContext)
	s.legacyExecer, _ = ci.(driver.Execer)   //lint:ignore SA1019 legacy drivers have nothing else
	s.legacyQueryer, _ = ci.(driver.Queryer) //lint:ignore SA1019 legacy drivers have nothing else
	s.preparer, _ = ci.(driver.ConnPrepareContext)
	s.beginner, _ = ci.(driver.ConnBeginTx)
	s.pinger, _ = ci.(driver.Pinger)
	s.resetter, _ = ci.(driver.SessionResetter)
	s.validator, _ = ci.(driver.Validator)
	s.checker, _ = ci.(driver.NamedValueChecker)
	return s
}

// pool keeps the sessions: an idle stack, callers waiting for a dial in
// FIFO order, and dials that finish for the next caller.
type pool struct {
	connector   driver.Connector
	dialTimeout time.Duration
	init        func(context.Context, driver.Conn) error // WithConnInit's, or nil

	mu      sync.Mutex
	idle    []*session // held by the pool; the last is the one given back last
	all     []*session // every open session, in the order they were dialed
	open    int        // sessions open or being dialed
	logical int        // logical connections open
	reqs    []chan got // callers waiting for a session, first first
	dialing int
	closed  bool
	// waiters mirrors len(reqs), and closing closed, for park's look
	// without the lock.
	waiters atomic.Int32
	closing atomic.Bool
	// parked counts the parked sessions, and idleLogical the logical
	// connections idle in database/sql's pool: given back (IsValid) and
	// not handed out again (ResetSession).
	parked      atomic.Int64
	idleLogical atomic.Int64
	epoch       atomic.Uint64 // bumped each time a session is found dead

	nDials, nDialErrors, nBad atomic.Int64
}

// got is what a waiting caller gets: a session, or the dial's error, or
// the dial's panic.
type got struct {
	s        *session
	err      error
	panicked any
}

// errBad: the driver found a session dead (ErrBadConn on reset or ping).
var errBad = errors.New("bulkhead: the driver found the server connection bad")

// get takes the idle session given back last, or else a parked one (the
// first dialed), or else waits for a dial (started for the caller unless
// enough dials are already on their way) or for a session given back,
// whichever comes first, until ctx ends. The session is not made ready
// for use yet (see ready).
func (p *pool) get(ctx context.Context) (*session, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	if n := len(p.idle); n > 0 {
		s := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		return s, nil
	}
	if p.parked.Load() > 0 {
		for _, s := range p.all {
			if s.take() {
				p.parked.Add(-1)
				p.mu.Unlock()
				return s, nil
			}
		}
	}
	ch := make(chan got, 1)
	p.reqs = append(p.reqs, ch)
	p.waiters.Store(int32(len(p.reqs)))
	if p.dialing < len(p.reqs) {
		p.dialing++
		p.open++
		go p.dial(context.WithoutCancel(ctx))
	}
	p.mu.Unlock()
	select {
	case g := <-ch:
		if g.panicked != nil {
			panic(g.panicked)
		}
		return g.s, g.err
	case <-ctx.Done():
		p.mu.Lock()
		if i := slices.Index(p.reqs, ch); i >= 0 {
			p.reqs = slices.Delete(p.reqs, i, i+1)
			p.waiters.Store(int32(len(p.reqs)))
			p.mu.Unlock()
			return nil, ctx.Err()
		}
		p.mu.Unlock()
		if g := <-ch; g.s != nil { // handed over meanwhile
			p.put(g.s, false)
		}
		return nil, ctx.Err()
	}
}

// dial opens a session for the first waiting caller, with the caller's
// context values but not its cancellation, bounded by WithDialTimeout: a
// caller that gives up leaves the session to the next one. A failed dial
// fails the first caller not covered by another dial on its way.
func (p *pool) dial(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, p.dialTimeout)
	defer cancel()
	p.nDials.Add(1)
	var g got
	func() {
		defer func() {
			if v := recover(); v != nil {
				g = got{panicked: v}
			}
		}()
		ci, err := p.connector.Connect(ctx)
		switch {
		case err != nil:
			g.err = err
		case ci == nil:
			g.err = errors.New("bulkhead: the driver's Connect returned neither a connection nor an error")
		default:
			g.s = newSession(ci)
		}
	}()
	if g.s == nil {
		p.nDialErrors.Add(1)
	}
	p.mu.Lock()
	p.dialing--
	if g.s == nil {
		p.open--
		var ch chan got
		if len(p.reqs) > p.dialing {
			ch = p.reqs[0]
			p.reqs = p.reqs[1:]
			p.waiters.Store(int32(len(p.reqs)))
		}
		p.mu.Unlock()
		if ch != nil {
			ch <- g
		}
		return
	}
	g.s.checked = p.epoch.Load()
	p.all = append(p.all, g.s)
	closing := p.handLocked(g.s)
	p.mu.Unlock()
	closeAll(closing)
}

// put takes back a session its holder is done with; used says whether
// the holder ran anything on it (the driver then resets it before its
// next use, as database/sql resets a connection it hands out again).
func (p *pool) put(s *session, used bool) {
	p.giveBack(s, used, false)
}

// park leaves s, held by a logical connection database/sql takes back,
// parked on it, and counts that connection idle, unless callers wait for
// a session, the pool is closed, or idle logical connections without a
// session outnumber the idle sessions (a parked one was taken or found
// dead): then it reports false, and the caller gives s back (giveBack),
// where it serves one of those.
func (p *pool) park(s *session, used bool) bool {
	if p.waiters.Load() > 0 || p.closing.Load() || p.idleLogical.Load() > p.parked.Load() && p.excess(0) {
		return false
	}
	if used {
		s.dirty = true
	}
	p.closePending(s)
	p.parked.Add(1)
	p.idleLogical.Add(1)
	s.state.Store(parked)
	return true
}

// excess reports whether the idle logical connections without a parked
// session, but for leaving, outnumber the idle sessions and dials on
// their way: database/sql keeps more idle connections than the gate has
// server connections for.
func (p *pool) excess(leaving int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.idleLogical.Load()-p.parked.Load()-leaving > int64(len(p.idle)+p.dialing)
}

// take makes a parked session held by the caller, and reports whether it
// did. The owner takes its own without the pool's lock; anyone else
// holds the lock.
func (s *session) take() bool { return s.state.CompareAndSwap(parked, held) }

// unpark takes back the session s parked on its logical connection, if
// it is still there, and reports whether it did.
func (p *pool) unpark(s *session) bool {
	if s.take() {
		p.parked.Add(-1)
		return true
	}
	return false
}

// giveBack is put, for s if not nil; with logical, it is also called as
// database/sql takes the logical connection that held s back, and reports
// whether database/sql may keep that connection idle: whether the idle
// logical connections stay within the idle sessions (and the dials on
// their way). It then counts it idle.
func (p *pool) giveBack(s *session, used, logical bool) (keep bool) {
	if s != nil {
		if used {
			s.dirty = true
		}
		p.closePending(s)
	}
	p.mu.Lock()
	var closing []*session
	if s != nil {
		closing = p.handLocked(s)
	}
	// A dial on its way counts as idle: its session needs a logical
	// connection to stay (sessions never outnumber them).
	if logical && p.idleLogical.Load() < int64(len(p.idle)+p.dialing)+p.parked.Load() {
		p.idleLogical.Add(1)
		keep = true
	}
	p.mu.Unlock()
	closeAll(closing)
	return keep
}

// handLocked gives s to the first waiting caller, or else makes it idle,
// then returns the sessions to close: s if the pool is closed, and the
// coldest idle ones while the pool keeps more sessions than database/sql
// keeps logical connections.
func (p *pool) handLocked(s *session) []*session {
	if p.closed {
		p.dropLocked(s)
		return []*session{s}
	}
	if len(p.reqs) > 0 {
		ch := p.reqs[0]
		p.reqs = p.reqs[1:]
		p.waiters.Store(int32(len(p.reqs)))
		ch <- got{s: s}
		return nil
	}
	p.idle = append(p.idle, s)
	return p.trimLocked()
}

// trimLocked takes out the coldest idle sessions while the pool keeps
// more than database/sql's logical connections, for the caller to close.
func (p *pool) trimLocked() []*session {
	var out []*session
	for p.open > p.logical && len(p.idle) > 0 {
		s := p.idle[0]
		p.idle = p.idle[1:]
		p.dropLocked(s)
		out = append(out, s)
	}
	return out
}

// dropLocked forgets s, which the caller will close.
func (p *pool) dropLocked(s *session) {
	p.open--
	s.state.Store(gone)
	if i := slices.Index(p.all, s); i >= 0 {
		p.all = slices.Delete(p.all, i, i+1)
	}
}

func closeAll(ss []*session) {
	for _, s := range ss {
		closeQuietly(s.ci)
	}
}

// closeQuietly closes a driver connection, ignoring its error and a
// panic: it is being discarded.
func closeQuietly(c interface{ Close() error }) {
	defer func() { _ = recover() }()
	c.Close()
}

// discard closes s, held by the caller. bad says the driver found it
// dead: the other idle sessions are then checked before their next use,
// and bad counted.
func (p *pool) discard(s *session, bad bool) {
	if bad {
		p.nBad.Add(1)
		p.epoch.Add(1)
	}
	p.mu.Lock()
	p.dropLocked(s)
	p.mu.Unlock()
	closeQuietly(s.ci)
}

// logicalOpened and logicalClosed count the logical connections.
func (p *pool) logicalOpened() {
	p.mu.Lock()
	p.logical++
	p.mu.Unlock()
}

func (p *pool) logicalClosed(idle bool) {
	if idle {
		p.idleLogical.Add(-1)
	}
	p.mu.Lock()
	p.logical--
	closing := p.trimLocked()
	p.mu.Unlock()
	closeAll(closing)
}

// ready makes s, just taken, fit for a new use, as database/sql makes a
// pooled connection it hands out: it is pinged if a session was found dead
// since s was last known alive; it is reset (the driver's
// SessionResetter) if it was used since its last reset; WithConnInit's
// function runs on it if it never did. It returns errBad if the driver
// found s dead, ctx's error if ctx ended meanwhile, or the init's error
// (an *initError); s is then still the caller's.
func (p *pool) ready(ctx context.Context, s *session) error {
	p.closePending(s)
	if e := p.epoch.Load(); s.checked != e {
		if s.pinger != nil {
			if err := s.pinger.Ping(ctx); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return errBad
			}
		}
		s.checked = e
	}
	if s.dirty && s.resetter != nil {
		if err := s.resetter.ResetSession(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, driver.ErrBadConn) {
				return errBad
			}
			// Other errors are ignored, as database/sql ignores them.
		}
	}
	s.dirty = false
	if !s.inited && p.init != nil {
		if err := p.init(ctx, s.ci); err != nil {
			return &initError{err}
		}
	}
	s.inited = true
	return nil
}

// initError is the error of WithConnInit's function: the session is
// closed, and the use that needed it fails with the error.
type initError struct{ err error }

func (e *initError) Error() string { return e.err.Error() }
func (e *initError) Unwrap() error { return e.err }

// preparedOn records that s prepared q, forgetting the closed sessions.
func (p *pool) preparedOn(q *query, s *session) {
	p.mu.Lock()
	q.on = slices.DeleteFunc(q.on, func(s *session) bool { return s.state.Load() == gone })
	q.on = append(q.on, s)
	p.mu.Unlock()
}

// closeEverywhere closes q's driver statement on every session that
// prepared it: now on those idle or parked (taken meanwhile), else when
// its holder gives it back.
func (p *pool) closeEverywhere(q *query) {
	var idle, parkedOnes []*session
	p.mu.Lock()
	for _, s := range q.on {
		if s.state.Load() == gone {
			continue
		}
		s.pending = append(s.pending, q)
		s.closing.Store(true)
		if i := slices.Index(p.idle, s); i >= 0 {
			p.idle = slices.Delete(p.idle, i, i+1)
			idle = append(idle, s)
		} else if s.take() {
			parkedOnes = append(parkedOnes, s)
		}
	}
	q.on = nil
	p.mu.Unlock()
	for _, s := range parkedOnes {
		p.closePending(s)
		s.state.Store(parked) // back to its logical connection
	}
	for _, s := range idle {
		p.closePending(s)
		p.mu.Lock()
		closing := p.handLocked(s)
		p.mu.Unlock()
		closeAll(closing)
	}
}

// closePending closes the statements closeEverywhere left for s, held by the
// caller.
func (p *pool) closePending(s *session) {
	if !s.closing.Load() {
		return
	}
	p.mu.Lock()
	qs := s.pending
	s.pending = nil
	s.closing.Store(false)
	p.mu.Unlock()
	for _, q := range qs {
		if si, ok := s.stmts[q]; ok {
			delete(s.stmts, q)
			closeQuietly(si)
		}
	}
}

// close closes the idle and parked sessions and fails the waiting
// callers with ErrClosed; sessions in use are closed when they are given
// back.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	p.closing.Store(true)
	idle := p.idle
	p.idle = nil
	for _, s := range p.all {
		if s.take() {
			p.parked.Add(-1)
			idle = append(idle, s)
		}
	}
	for _, s := range idle {
		p.dropLocked(s)
	}
	reqs := p.reqs
	p.reqs = nil
	p.waiters.Store(0)
	p.mu.Unlock()
	for _, ch := range reqs {
		ch <- got{err: ErrClosed}
	}
	closeAll(idle)
}

// counts returns the sessions open (or being dialed) and idle (or
// parked).
func (p *pool) counts() (open, idle int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open, len(p.idle) + int(p.parked.Load())
}

// The driver calls on a session, made as database/sql would make them on
// a connection of its own pool: the context form when the driver has it,
// else the legacy form after the checks database/sql makes.

func (s *session) prepare(ctx context.Context, query string) (driver.Stmt, error) {
	if s.preparer != nil {
		return s.preparer.PrepareContext(ctx, query)
	}
	si, err := s.ci.Prepare(query)
	if err == nil && ctx.Err() != nil {
		si.Close()
		return nil, ctx.Err()
	}
	return si, err
}

func (s *session) begin(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if s.beginner != nil {
		return s.beginner.BeginTx(ctx, opts)
	}
	if opts.Isolation != driver.IsolationLevel(0) {
		return nil, errors.New("bulkhead: driver does not support non-default isolation level")
	}
	if opts.ReadOnly {
		return nil, errors.New("bulkhead: driver does not support read-only transactions")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ti, err := s.ci.Begin() //lint:ignore SA1019 legacy drivers have nothing else
	if err == nil && ctx.Err() != nil {
		ti.Rollback()
		return nil, ctx.Err()
	}
	return ti, err
}

// exec runs query on s; driver.ErrSkip when the driver has no Execer.
func (s *session) exec(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if s.execer != nil {
		return s.execer.ExecContext(ctx, query, args)
	}
	if s.legacyExecer == nil {
		return nil, driver.ErrSkip
	}
	dargs, err := namedValueToValue(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.legacyExecer.Exec(query, dargs) //lint:ignore SA1019 legacy drivers have nothing else
}

// query runs query on s; driver.ErrSkip when the driver has no Queryer.
func (s *session) query(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if s.queryer != nil {
		return s.queryer.QueryContext(ctx, query, args)
	}
	if s.legacyQueryer == nil {
		return nil, driver.ErrSkip
	}
	dargs, err := namedValueToValue(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.legacyQueryer.Query(query, dargs) //lint:ignore SA1019 legacy drivers have nothing else
}

func namedValueToValue(named []driver.NamedValue) ([]driver.Value, error) {
	args := make([]driver.Value, len(named))
	for i, nv := range named {
		if nv.Name != "" {
			return nil, errors.New("bulkhead: driver does not support the use of named parameters")
		}
		args[i] = nv.Value
	}
	return args, nil
}
