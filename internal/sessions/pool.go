// Package sessions keeps a gate's server connections (sessions): an idle
// stack, parking on the logical connections database/sql keeps, FIFO
// waiters and dials, within the budget's B.
package sessions

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
// sessions would outnumber B less the execution permits held (Pool.spare).

// Pool keeps the sessions: an idle stack, FIFO waiters, and dials. Its
// exported fields are set before its first use.
type Pool struct {
	Connector   driver.Connector
	DialTimeout time.Duration
	Init        func(context.Context, driver.Conn) error // WithConnInit's, or nil
	// Limit returns the global budget's B for the sessions, and whether it
	// enforces it (not in dry-run); nil: never. It is called with or without
	// mu held.
	Limit  func() (b int, enforced bool)
	Closed error // what Get returns once the pool is closed
	// InOps counts the sessions of operations holding their permits (from
	// the grant of their execution permit to its release).
	InOps atomic.Int64

	mu          sync.Mutex
	idle        []*Session // held by the pool; the last is the one given back last
	all         []*Session // every open session, in the order they were dialed
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
	epoch       atomic.Uint64 // bumped each time a session is found dead

	nDials, nDialErrors, nBad atomic.Int64
}

// got is what a waiting caller gets from a dial or a give-back.
type got struct {
	s        *Session
	err      error
	panicked any
}

// ErrBad: the driver found a session dead (ErrBadConn on reset or ping).
var ErrBad = errors.New("bulkhead: the driver found the server connection bad")

// LingerWait is how long a caller that finds no free session waits for a
// give-back before dialing, once B sessions are open: at most B operations
// run, so one session is between operations (its operation just ended, or
// a *sql.Conn keeps it).
var LingerWait = 2 * time.Millisecond // a variable for tests

// Get takes the idle session given back last, else a parked one, else
// waits for a dial or a give-back until ctx ends: the dial starts at once if
// fewer than B sessions are open, else after LingerWait without a give-back.
// The caller makes it ready.
func (p *Pool) Get(ctx context.Context) (*Session, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, p.Closed
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
			if p.Unpark(s) {
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
			later = time.AfterFunc(LingerWait, func() { p.dialFor(dctx, ch) })
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
				p.Put(g.s, false)
			}
		}
		return nil, ctx.Err()
	}
}

// limits is Limit's answer; never enforced without Limit.
func (p *Pool) limits() (b int, enforced bool) {
	if p.Limit == nil {
		return 0, false
	}
	return p.Limit()
}

// dialLocked starts a dial for the waiters.
func (p *Pool) dialLocked(ctx context.Context) {
	p.dialing++
	p.open++
	go p.dial(ctx)
}

// dialFor starts a dial if ch still waits and the dials on their way cover
// fewer than the waiters.
func (p *Pool) dialFor(ctx context.Context, ch chan got) {
	p.mu.Lock()
	if p.dialing < len(p.reqs) && slices.Contains(p.reqs, ch) {
		p.dialLocked(ctx)
	}
	p.mu.Unlock()
}

// dial opens a session for the first waiter, bounded by WithDialTimeout; a
// failure fails the first waiter not covered by another dial.
func (p *Pool) dial(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, p.DialTimeout)
	defer cancel()
	p.nDials.Add(1)
	var g got
	func() {
		defer func() {
			if v := recover(); v != nil {
				g = got{panicked: v}
			}
		}()
		ci, err := p.Connector.Connect(ctx)
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

// Put takes back s from its holder; used has it reset before its next use.
func (p *Pool) Put(s *Session, used bool) { p.GiveBack(s, used, false) }

// Park parks s on the logical connection database/sql takes back, counted
// idle; false (give s back) if callers wait, the pool is closed, excess or s
// is spare.
func (p *Pool) Park(s *Session, used bool) bool {
	if p.waiters.Load() > 0 || p.closing.Load() || p.idleLogical.Load() > p.parked.Load() && p.Excess(0) || p.spare() {
		return false
	}
	if used {
		s.dirty = true
	}
	p.ClosePending(s)
	p.parked.Add(1)
	p.idleLogical.Add(1)
	s.state.Store(parked)
	if p.waiters.Load() > 0 { // a caller began to wait for a session as it parked: it is theirs
		p.mu.Lock()
		if len(p.reqs) > 0 && !p.closed && p.Unpark(s) {
			ch := p.reqs[0]
			p.reqs = p.reqs[1:]
			p.waiters.Store(int32(len(p.reqs)))
			ch <- got{s: s}
		}
		p.mu.Unlock()
	}
	return true
}

// Excess reports whether the idle logical connections without a parked
// session, less leaving, outnumber the idle sessions and dials on their way.
func (p *Pool) Excess(leaving int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.idleLogical.Load()-p.parked.Load()-leaving > int64(len(p.idle)+p.dialing)
}

// Unpark is take, counted.
func (p *Pool) Unpark(s *Session) bool {
	if s.take() {
		p.parked.Add(-1)
		return true
	}
	return false
}

// GiveBack is Put, for s if not nil; with logical, it also reports whether
// the logical connection database/sql takes back may stay idle, counted.
func (p *Pool) GiveBack(s *Session, used, logical bool) (keep bool) {
	if s != nil {
		if used {
			s.dirty = true
		}
		p.ClosePending(s)
	}
	p.mu.Lock()
	var closing []*Session
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
func (p *Pool) handLocked(s *Session) []*Session {
	if len(p.reqs) > 0 && !p.closed {
		ch := p.reqs[0]
		p.reqs = p.reqs[1:]
		p.waiters.Store(int32(len(p.reqs)))
		ch <- got{s: s}
		return nil
	}
	if p.closed || p.spare() {
		p.dropLocked(s)
		return []*Session{s}
	}
	p.idle = append(p.idle, s)
	p.nIdle.Store(int64(len(p.idle)))
	return p.trimLocked()
}

// trimLocked takes out the coldest idle sessions beyond the logical ones.
func (p *Pool) trimLocked() []*Session {
	var out []*Session
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
func (p *Pool) spare() bool {
	// inOps first: a session taken leaves the free ones before its
	// operation counts in inOps, so this order never counts it twice.
	in := int(p.InOps.Load())
	free := int(p.nIdle.Load() + p.parked.Load())
	if free == 0 {
		return false
	}
	b, on := p.limits()
	return on && free+1+in > b
}

// dropLocked forgets s, which the caller will close.
func (p *Pool) dropLocked(s *Session) {
	p.open--
	s.state.Store(gone)
	if i := slices.Index(p.all, s); i >= 0 {
		p.all = slices.Delete(p.all, i, i+1)
	}
}

func closeAll(ss []*Session) {
	for _, s := range ss {
		closeQuietly(s.Conn)
	}
}

// Discard closes s, held by the caller; bad has the others checked.
func (p *Pool) Discard(s *Session, bad bool) {
	if bad {
		p.nBad.Add(1)
		p.epoch.Add(1)
	}
	p.mu.Lock()
	p.dropLocked(s)
	p.mu.Unlock()
	closeQuietly(s.Conn)
}

// LogicalOpened and LogicalClosed count the logical connections.
func (p *Pool) LogicalOpened() {
	p.mu.Lock()
	p.logical++
	p.mu.Unlock()
}

func (p *Pool) LogicalClosed() {
	p.mu.Lock()
	p.logical--
	closing := p.trimLocked()
	p.mu.Unlock()
	closeAll(closing)
}

// Ready pings s if a session was found dead since it was checked, resets
// it if used, and inits it once. It returns ErrBad, ctx's error or an
// *InitError; s is then still the caller's.
func (p *Pool) Ready(ctx context.Context, s *Session) error {
	p.ClosePending(s)
	if e := p.epoch.Load(); s.checked != e {
		if s.Pinger != nil {
			if err := s.Pinger.Ping(ctx); err != nil {
				return cmp.Or(ctx.Err(), ErrBad)
			}
		}
		s.checked = e
	}
	if s.dirty && s.Resetter != nil {
		if err := s.Resetter.ResetSession(ctx); err != nil {
			if cerr := ctx.Err(); cerr != nil || errors.Is(err, driver.ErrBadConn) {
				return cmp.Or(cerr, ErrBad)
			}
			// database/sql ignores other errors.
		}
	}
	s.dirty = false
	if !s.inited && p.Init != nil {
		if err := p.Init(ctx, s.Conn); err != nil {
			return &InitError{err}
		}
	}
	s.inited = true
	return nil
}

// InitError is WithConnInit's error: it closes the session.
type InitError struct{ Err error }

func (e *InitError) Error() string { return e.Err.Error() }
func (e *InitError) Unwrap() error { return e.Err }

// Prepared records si as q's driver statement on s, held by the caller,
// forgetting the closed sessions.
func (p *Pool) Prepared(q *Query, s *Session, si driver.Stmt) {
	s.stmts[q] = si
	p.mu.Lock()
	q.on = slices.DeleteFunc(q.on, func(s *Session) bool { return s.state.Load() == gone })
	q.on = append(q.on, s)
	p.mu.Unlock()
}

// CloseEverywhere closes q's driver statements: now on the idle and parked
// sessions (a parked one then goes to the pool, where its connection finds
// it), else before the session's next use.
func (p *Pool) CloseEverywhere(q *Query) {
	var free []*Session
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
		} else if p.Unpark(s) {
			free = append(free, s)
		}
	}
	q.on = nil
	p.mu.Unlock()
	for _, s := range free {
		p.Put(s, false)
	}
}

// ClosePending closes the statements CloseEverywhere left for s.
func (p *Pool) ClosePending(s *Session) {
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

// Close closes the idle and parked sessions, failing waiters with p.Closed.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	p.closing.Store(true)
	idle, reqs := p.idle, p.reqs
	p.idle, p.reqs = nil, nil
	p.nIdle.Store(0)
	for _, s := range p.all {
		if p.Unpark(s) {
			idle = append(idle, s)
		}
	}
	for _, s := range idle {
		p.dropLocked(s)
	}
	p.waiters.Store(0)
	p.mu.Unlock()
	for _, ch := range reqs {
		ch <- got{err: p.Closed}
	}
	closeAll(idle)
}

// Counts returns the sessions open (or being dialed), idle or parked, and
// the dials, failed dials and sessions found bad so far.
func (p *Pool) Counts() (open, idle int, dials, dialErrors, bad int64) {
	p.mu.Lock()
	open, idle = p.open, len(p.idle)+int(p.parked.Load())
	p.mu.Unlock()
	return open, idle, p.nDials.Load(), p.nDialErrors.Load(), p.nBad.Load()
}

// Waiting returns the callers waiting for a session.
func (p *Pool) Waiting() int { return int(p.waiters.Load()) }

// NotIdle counts one logical connection idle in database/sql's pool fewer.
func (p *Pool) NotIdle() { p.idleLogical.Add(-1) }
