package bulkhead

import (
	"cmp"
	"context"
	"database/sql/driver"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The server connections (sessions). A logical connection database/sql
// takes back keeps its session parked: its next operation, or anyone who
// finds no idle session (under the pool's lock), takes it with one CAS.
// Invariants: sessions never outnumber logical connections; idle logical
// connections never outnumber idle or parked sessions (one beyond is
// reported invalid or bad, and database/sql discards it); and a session
// given back beside another free one is closed if, with it, the free
// sessions would outnumber B less the execution permits held (pool.spare).

// Session states: held by one holder, parked, or closed.
const (
	held int32 = iota
	parked
	gone
)

// session is a driver connection and its optional interfaces. Its plain
// fields belong to its one holder, and pass to the next through state.
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
	s := &session{ci: ci, stmts: map[*query]driver.Stmt{}}
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

// pool keeps the sessions: an idle stack, FIFO waiters, and dials.
type pool struct {
	connector   driver.Connector
	dialTimeout time.Duration
	init        func(context.Context, driver.Conn) error // WithConnInit's, or nil
	// limit returns the global budget's B for the sessions, and whether it
	// enforces it (not in dry-run); nil: never. It is called with or without
	// mu held.
	limit func() (b int, enforced bool)

	mu          sync.Mutex
	idle        []*session // held by the pool; the last is the one given back last
	all         []*session // every open session, in the order they were dialed
	open        int        // sessions open or being dialed
	logical     int        // logical connections open
	reqs        []chan got // callers waiting for a session, first first
	dialing     int
	closed      bool
	waiters     atomic.Int32  // len(reqs), read without the lock
	closing     atomic.Bool   // closed, read without the lock
	parked      atomic.Int64  // parked sessions
	nIdle       atomic.Int64  // len(idle), read without the lock
	idleLogical atomic.Int64  // logical connections idle in database/sql's pool
	inOps       atomic.Int64  // sessions of operations holding their permits (Gate.admitted to Gate.release)
	epoch       atomic.Uint64 // bumped each time a session is found dead

	nDials, nDialErrors, nBad atomic.Int64
}

// got is what a waiting caller gets from a dial or a give-back.
type got struct {
	s        *session
	err      error
	panicked any
}

// errBad: the driver found a session dead (ErrBadConn on reset or ping).
var errBad = errors.New("bulkhead: the driver found the server connection bad")

// lingerWait is how long a caller that finds no free session waits for a
// give-back before dialing, once B sessions are open: at most B operations
// run, so one session is between operations (its operation just ended, or
// a *sql.Conn keeps it).
var lingerWait = 2 * time.Millisecond // a variable for tests

// get takes the idle session given back last, else a parked one, else
// waits for a dial or a give-back until ctx ends: the dial starts at once if
// fewer than B sessions are open, else after lingerWait without a give-back.
// The caller makes it ready.
func (p *pool) get(ctx context.Context) (*session, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	if n := len(p.idle); n > 0 {
		s := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.nIdle.Store(int64(n - 1))
		p.mu.Unlock()
		return s, nil
	}
	// Counted among the waiters before it looks at the parked sessions: a
	// session parked meanwhile is either seen here or handed over by park.
	p.waiters.Add(1)
	if p.parked.Load() > 0 {
		for _, s := range p.all {
			if p.unpark(s) {
				p.waiters.Add(-1)
				p.mu.Unlock()
				return s, nil
			}
		}
	}
	ch := make(chan got, 1)
	p.reqs = append(p.reqs, ch)
	p.waiters.Store(int32(len(p.reqs)))
	var later *time.Timer
	if p.dialing < len(p.reqs) {
		dctx := context.WithoutCancel(ctx)
		if b, on := p.limits(); on && p.open >= b {
			later = time.AfterFunc(lingerWait, func() { p.dialFor(dctx, ch) })
		} else {
			p.dialLocked(dctx)
		}
	}
	p.mu.Unlock()
	if later != nil {
		defer later.Stop()
	}
	select {
	case g := <-ch:
		if g.panicked != nil {
			panic(g.panicked)
		}
		return g.s, g.err
	case <-ctx.Done():
		p.mu.Lock()
		i := slices.Index(p.reqs, ch)
		if i >= 0 {
			p.reqs = slices.Delete(p.reqs, i, i+1)
			p.waiters.Store(int32(len(p.reqs)))
		}
		p.mu.Unlock()
		if i < 0 { // handed over meanwhile
			if g := <-ch; g.s != nil {
				p.put(g.s, false)
			}
		}
		return nil, ctx.Err()
	}
}

// limits is limit's answer; never enforced without limit.
func (p *pool) limits() (b int, enforced bool) {
	if p.limit == nil {
		return 0, false
	}
	return p.limit()
}

// dialLocked starts a dial for the waiters.
func (p *pool) dialLocked(ctx context.Context) {
	p.dialing++
	p.open++
	go p.dial(ctx)
}

// dialFor starts a dial if ch still waits and the dials on their way cover
// fewer than the waiters.
func (p *pool) dialFor(ctx context.Context, ch chan got) {
	p.mu.Lock()
	if p.dialing < len(p.reqs) && slices.Contains(p.reqs, ch) {
		p.dialLocked(ctx)
	}
	p.mu.Unlock()
}

// dial opens a session for the first waiter, bounded by WithDialTimeout; a
// failure fails the first waiter not covered by another dial.
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
	p.mu.Lock()
	p.dialing--
	if g.s == nil {
		p.nDialErrors.Add(1)
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

// put takes back s from its holder; used has it reset before its next use.
func (p *pool) put(s *session, used bool) { p.giveBack(s, used, false) }

// park parks s on the logical connection database/sql takes back, counted
// idle; false (give s back) if callers wait, the pool is closed, excess or s
// is spare.
func (p *pool) park(s *session, used bool) bool {
	if p.waiters.Load() > 0 || p.closing.Load() || p.idleLogical.Load() > p.parked.Load() && p.excess(0) || p.spare() {
		return false
	}
	if used {
		s.dirty = true
	}
	p.closePending(s)
	p.parked.Add(1)
	p.idleLogical.Add(1)
	s.state.Store(parked)
	if p.waiters.Load() > 0 { // a caller began to wait for a session as it parked: it is theirs
		p.mu.Lock()
		if len(p.reqs) > 0 && !p.closed && p.unpark(s) {
			ch := p.reqs[0]
			p.reqs = p.reqs[1:]
			p.waiters.Store(int32(len(p.reqs)))
			ch <- got{s: s}
		}
		p.mu.Unlock()
	}
	return true
}

// excess reports whether the idle logical connections without a parked
// session, less leaving, outnumber the idle sessions and dials on their way.
func (p *pool) excess(leaving int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.idleLogical.Load()-p.parked.Load()-leaving > int64(len(p.idle)+p.dialing)
}

// take holds a parked s; anyone but its logical connection holds p.mu.
func (s *session) take() bool { return s.state.CompareAndSwap(parked, held) }

// unpark is take, counted.
func (p *pool) unpark(s *session) bool {
	if s.take() {
		p.parked.Add(-1)
		return true
	}
	return false
}

// giveBack is put, for s if not nil; with logical, it also reports whether
// the logical connection database/sql takes back may stay idle, counted.
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
	if logical && p.idleLogical.Load() < int64(len(p.idle)+p.dialing)+p.parked.Load() {
		p.idleLogical.Add(1)
		keep = true
	}
	p.mu.Unlock()
	closeAll(closing)
	return keep
}

// handLocked gives s to the first waiter, else idles it unless spare; it
// returns the sessions to close.
func (p *pool) handLocked(s *session) []*session {
	if len(p.reqs) > 0 && !p.closed {
		ch := p.reqs[0]
		p.reqs = p.reqs[1:]
		p.waiters.Store(int32(len(p.reqs)))
		ch <- got{s: s}
		return nil
	}
	if p.closed || p.spare() {
		p.dropLocked(s)
		return []*session{s}
	}
	p.idle = append(p.idle, s)
	p.nIdle.Store(int64(len(p.idle)))
	return p.trimLocked()
}

// trimLocked takes out the coldest idle sessions beyond the logical ones.
func (p *pool) trimLocked() []*session {
	var out []*session
	for p.open > p.logical && len(p.idle) > 0 {
		s := p.idle[0]
		p.idle = p.idle[1:]
		p.nIdle.Store(int64(len(p.idle)))
		p.dropLocked(s)
		out = append(out, s)
	}
	return out
}

// spare reports whether a session given back now, with nobody waiting
// for one, would be beyond what the budget can run: another is idle or
// parked, and with it the free ones and those running operations outnumber
// B. An operation granted its permits but not its session yet counts among
// the free ones' takers, not the running: a give-back racing its grant is
// not spare. Sessions kept between operations (a *sql.Conn) are not counted.
func (p *pool) spare() bool {
	// inOps first: a session taken leaves the free ones before its
	// operation counts in inOps, so this order never counts it twice.
	in := int(p.inOps.Load())
	free := int(p.nIdle.Load() + p.parked.Load())
	if free == 0 {
		return false
	}
	b, on := p.limits()
	return on && free+1+in > b
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

// closeQuietly closes c, ignoring its error and a panic.
func closeQuietly(c interface{ Close() error }) {
	defer func() { _ = recover() }()
	c.Close()
}

// discard closes s, held by the caller; bad has the others checked.
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

func (p *pool) logicalClosed() {
	p.mu.Lock()
	p.logical--
	closing := p.trimLocked()
	p.mu.Unlock()
	closeAll(closing)
}

// ready pings s if a session was found dead since it was checked, resets
// it if used, and inits it once. It returns errBad, ctx's error or an
// *initError; s is then still the caller's.
func (p *pool) ready(ctx context.Context, s *session) error {
	p.closePending(s)
	if e := p.epoch.Load(); s.checked != e {
		if s.pinger != nil {
			if err := s.pinger.Ping(ctx); err != nil {
				return cmp.Or(ctx.Err(), errBad)
			}
		}
		s.checked = e
	}
	if s.dirty && s.resetter != nil {
		if err := s.resetter.ResetSession(ctx); err != nil {
			if cerr := ctx.Err(); cerr != nil || errors.Is(err, driver.ErrBadConn) {
				return cmp.Or(cerr, errBad)
			}
			// database/sql ignores other errors.
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

// initError is WithConnInit's error: it closes the session.
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

// closeEverywhere closes q's driver statements: now on the idle and parked
// sessions (a parked one then goes to the pool, where its connection finds
// it), else before the session's next use.
func (p *pool) closeEverywhere(q *query) {
	var free []*session
	p.mu.Lock()
	for _, s := range q.on {
		if s.state.Load() == gone {
			continue
		}
		s.pending = append(s.pending, q)
		s.closing.Store(true)
		if i := slices.Index(p.idle, s); i >= 0 {
			p.idle = slices.Delete(p.idle, i, i+1)
			p.nIdle.Store(int64(len(p.idle)))
			free = append(free, s)
		} else if p.unpark(s) {
			free = append(free, s)
		}
	}
	q.on = nil
	p.mu.Unlock()
	for _, s := range free {
		p.put(s, false)
	}
}

// closePending closes the statements closeEverywhere left for s.
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

// close closes the idle and parked sessions, failing waiters with ErrClosed.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	p.closing.Store(true)
	idle, reqs := p.idle, p.reqs
	p.idle, p.reqs = nil, nil
	p.nIdle.Store(0)
	for _, s := range p.all {
		if p.unpark(s) {
			idle = append(idle, s)
		}
	}
	for _, s := range idle {
		p.dropLocked(s)
	}
	p.waiters.Store(0)
	p.mu.Unlock()
	for _, ch := range reqs {
		ch <- got{err: ErrClosed}
	}
	closeAll(idle)
}

// counts returns the sessions open (or being dialed) and idle or parked.
func (p *pool) counts() (open, idle int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open, len(p.idle) + int(p.parked.Load())
}

// The driver calls on a session, made as database/sql makes them.

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

// exec runs query on s, whose driver has an Execer of either form.
func (s *session) exec(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if s.execer != nil {
		return s.execer.ExecContext(ctx, query, args)
	}
	dargs, err := legacyArgs(ctx, args)
	if err != nil {
		return nil, err
	}
	return s.legacyExecer.Exec(query, dargs) //lint:ignore SA1019 legacy drivers have nothing else
}

// query runs query on s, whose driver has a Queryer of either form.
func (s *session) query(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if s.queryer != nil {
		return s.queryer.QueryContext(ctx, query, args)
	}
	dargs, err := legacyArgs(ctx, args)
	if err != nil {
		return nil, err
	}
	return s.legacyQueryer.Query(query, dargs) //lint:ignore SA1019 legacy drivers have nothing else
}

// legacyArgs checks args for a legacy driver call: no names, ctx not ended.
func legacyArgs(ctx context.Context, named []driver.NamedValue) ([]driver.Value, error) {
	args := make([]driver.Value, len(named))
	for i, nv := range named {
		if nv.Name != "" {
			return nil, errors.New("bulkhead: driver does not support the use of named parameters")
		}
		args[i] = nv.Value
	}
	return args, ctx.Err()
}
