package bulkhead

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// The server connections of a gate.
//
// database/sql hands a connection from its pool to each operation before
// the driver sees the operation. A gate therefore gives database/sql
// logical connections (conn.go) that hold no server connection while they
// wait for permits or sit idle in database/sql's pool, and keeps the
// server connections, sessions, here. An operation binds a session only
// once it holds its permits, preferring the one its logical connection had
// last and otherwise the most recently used; it gives the session back
// when database/sql takes the logical connection back into its pool
// (Validator.IsValid) or closes it. A *sql.Conn therefore keeps one
// session from its first statement until it is closed, as with plain
// database/sql, and each checkout of a pooled connection may get another
// one, as with plain database/sql.
//
// The pool opens at most max sessions (MaxConns, B+Q). A session is
// reset (the driver's SessionResetter) when it passes from one checkout to
// the next, checked (the driver's Validator) when it is given back, and
// closed when it fails either, like database/sql does for its own pool.

// session is one server connection: a driver.Conn of the inner connector.
type session struct {
	ci driver.Conn

	// The optional interfaces of ci, asserted once; nil where it lacks one.
	execer        driver.ExecerContext
	legacyExecer  driver.Execer
	queryer       driver.QueryerContext
	legacyQueryer driver.Queryer
	beginner      driver.ConnBeginTx
	preparer      driver.ConnPrepareContext
	pinger        driver.Pinger
	resetter      driver.SessionResetter
	validator     driver.Validator
	checker       driver.NamedValueChecker
	// keepOnRollback is database/sql's own rule for ci: a connection whose
	// transaction was rolled back after its context ended is kept only if
	// the driver can reset and validate it.
	keepOnRollback bool

	created time.Time

	// Guarded by the pool's mu.
	state      sessionState
	idleSince  time.Time
	prev, next *session      // the idle list
	pending    []driver.Stmt // statement closes deferred until the session is free

	// Owned by whoever holds the session: the logical connection bound
	// to it, or the pool while it is idle. Handing it over goes through
	// the pool's mu.
	used    bool // bound before: reset before it is bound again
	discard bool // close it instead of keeping it when it is given back

	gone atomic.Bool // closed: statements prepared on it went with it
}

type sessionState uint8

const (
	sessionBound  sessionState = iota // held by a logical connection (or being handed to one)
	sessionIdle                       // in the idle list
	sessionClosed                     // closed
)

func newSession(ci driver.Conn) *session {
	s := &session{ci: ci, created: time.Now()}
	s.execer, _ = ci.(driver.ExecerContext)
	s.legacyExecer, _ = ci.(driver.Execer)
	s.queryer, _ = ci.(driver.QueryerContext)
	s.legacyQueryer, _ = ci.(driver.Queryer)
	s.beginner, _ = ci.(driver.ConnBeginTx)
	s.preparer, _ = ci.(driver.ConnPrepareContext)
	s.pinger, _ = ci.(driver.Pinger)
	s.resetter, _ = ci.(driver.SessionResetter)
	s.validator, _ = ci.(driver.Validator)
	s.checker, _ = ci.(driver.NamedValueChecker)
	s.keepOnRollback = s.resetter != nil && s.validator != nil
	return s
}

// mask is the set of optional interfaces a logical connection in front of
// sessions like s offers: those of s, with the legacy Execer and Queryer
// offered in their context forms (see conn.go).
func (s *session) mask() uint {
	var m uint
	if s.execer != nil || s.legacyExecer != nil {
		m |= 1 << 0
	}
	if s.queryer != nil || s.legacyQueryer != nil {
		m |= 1 << 1
	}
	if s.pinger != nil {
		m |= 1 << 2
	}
	if s.checker != nil {
		m |= 1 << 3
	}
	return m
}

// pool keeps a gate's sessions.
type pool struct {
	connector driver.Connector
	opt       *options

	ctx    context.Context // cancelled by close: ends the dials in flight
	cancel context.CancelFunc
	done   chan struct{} // closed by close

	mu           sync.Mutex
	top, bottom  *session // idle sessions, the most recently given back first
	idle         int
	open         int // sessions open or being dialed
	max          int
	wHead, wTail *connWaiter
	waiting      int
	closed       bool

	// proto describes the driver's connections once one was dialed: the
	// interfaces a logical connection offers, and a NamedValueChecker for
	// the arguments of an operation that has no session yet.
	proto    atomic.Pointer[protoInfo]
	learning chan struct{} // one dial at a time learns proto (Gate.learn)

	nDials, nDialErrors, nKept, nReset, nInvalid atomic.Int64
}

type protoInfo struct {
	mask    uint
	checker driver.NamedValueChecker
}

// connWaiter is one caller waiting for a session while max are open.
type connWaiter struct {
	ready      chan struct{} // closed, under mu, when granted
	s          *session      // the session handed over, or nil:
	slot       bool          // a place under max handed over: dial
	granted    bool
	next, prev *connWaiter
}

func newPool(connector driver.Connector, opt *options, max int) *pool {
	ctx, cancel := context.WithCancel(context.Background())
	return &pool{connector: connector, opt: opt, ctx: ctx, cancel: cancel, done: make(chan struct{}), max: max, learning: make(chan struct{}, 1)}
}

// errNoSession: max sessions were open and none came back within the wait.
var errNoSession = errors.New("bulkhead: no session")

// get returns a session for a logical connection that has none: hint, the
// session it had last, if that one is idle; else the most recently used
// idle one; else a new one if fewer than max are open (or unbounded, in
// dry-run); else the first one given back within wait (errNoSession after
// that). A session taken from the idle list is reset first, and closed and
// passed over when the driver says it is bad.
func (p *pool) get(ctx context.Context, hint *session, wait time.Duration, unbounded bool) (*session, error) {
	var timer *time.Timer
	var deadline time.Time
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		now := time.Now()
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		expired := p.expireLocked(now)
		s := p.takeIdleLocked(hint, now, &expired)
		if s == nil && (p.open < p.max || unbounded) {
			p.open++
			p.mu.Unlock()
			p.closeAll(expired)
			return p.dial(ctx)
		}
		if s != nil {
			p.mu.Unlock()
			p.closeAll(expired)
			if p.reset(ctx, s) {
				return s, nil
			}
			continue
		}
		if timer == nil {
			deadline = now.Add(wait)
		}
		left := deadline.Sub(now)
		if left <= 0 {
			p.mu.Unlock()
			p.closeAll(expired)
			return nil, errNoSession
		}
		w := &connWaiter{ready: make(chan struct{})}
		p.pushWaiterLocked(w)
		p.mu.Unlock()
		p.closeAll(expired)
		if timer == nil {
			timer = time.NewTimer(left)
		}
		var err error
		select {
		case <-w.ready:
		case <-timer.C:
			err = errNoSession
		case <-ctx.Done():
			err = ctx.Err()
		case <-p.done:
			err = ErrClosed
		}
		if err != nil {
			p.mu.Lock()
			if !w.granted {
				p.removeWaiterLocked(w)
				p.mu.Unlock()
				return nil, err
			}
			p.mu.Unlock()
			// Granted as the wait ended: hand it on.
			if w.s != nil {
				p.put(w.s)
			} else {
				p.slotFree()
			}
			return nil, err
		}
		if w.slot {
			return p.dial(ctx)
		}
		if p.reset(ctx, w.s) {
			return w.s, nil
		}
		// The session handed over was bad: look again, within the same
		// deadline (the timer runs on).
	}
}

// takeIdleLocked unlinks hint if it is idle, or else the most recently
// given back idle session, skipping (into expired) those past their
// lifetime. It returns nil if none is idle.
func (p *pool) takeIdleLocked(hint *session, now time.Time, expired *[]*session) *session {
	if hint != nil && hint.state == sessionIdle {
		p.unlinkLocked(hint)
		if !p.tooOld(hint, now) {
			return hint
		}
		*expired = append(*expired, hint)
	}
	for p.top != nil {
		s := p.top
		p.unlinkLocked(s)
		if !p.tooOld(s, now) {
			return s
		}
		*expired = append(*expired, s)
	}
	return nil
}

func (p *pool) tooOld(s *session, now time.Time) bool {
	return p.opt.maxLifetime > 0 && now.Sub(s.created) > p.opt.maxLifetime
}

// expireLocked unlinks the idle sessions that stayed idle longer than
// WithConnMaxIdleTime allows: the oldest are at the bottom of the list.
func (p *pool) expireLocked(now time.Time) []*session {
	if p.opt.maxIdleTime <= 0 {
		return nil
	}
	var out []*session
	for s := p.bottom; s != nil && now.Sub(s.idleSince) > p.opt.maxIdleTime; s = p.bottom {
		p.unlinkLocked(s)
		out = append(out, s)
	}
	return out
}

// unlinkLocked removes an idle session from the idle list; it is then
// held by the caller.
func (p *pool) unlinkLocked(s *session) {
	if s.prev != nil {
		s.prev.next = s.next
	} else {
		p.top = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	} else {
		p.bottom = s.prev
	}
	s.next, s.prev = nil, nil
	s.state = sessionBound
	p.idle--
}

func (p *pool) pushIdleLocked(s *session, now time.Time) {
	s.state = sessionIdle
	s.idleSince = now
	s.prev, s.next = nil, p.top
	if p.top != nil {
		p.top.prev = s
	} else {
		p.bottom = s
	}
	p.top = s
	p.idle++
}

func (p *pool) pushWaiterLocked(w *connWaiter) {
	w.prev = p.wTail
	if p.wTail != nil {
		p.wTail.next = w
	} else {
		p.wHead = w
	}
	p.wTail = w
	p.waiting++
}

func (p *pool) removeWaiterLocked(w *connWaiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		p.wHead = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		p.wTail = w.prev
	}
	w.next, w.prev = nil, nil
	p.waiting--
}

// grantLocked hands s (or, with s nil, a place under max) to the first
// waiter, if any.
func (p *pool) grantLocked(s *session) bool {
	w := p.wHead
	if w == nil {
		return false
	}
	p.removeWaiterLocked(w)
	w.s, w.slot, w.granted = s, s == nil, true
	close(w.ready)
	return true
}

// reset prepares s, taken from the idle list, for a new checkout with the
// driver's SessionResetter, as database/sql does when it reuses a pooled
// connection. A session the driver calls bad (driver.ErrBadConn) is closed
// and false returned; other errors are ignored, as database/sql ignores
// them. A panic closes the session and goes on up.
func (p *pool) reset(ctx context.Context, s *session) bool {
	if !s.used || s.resetter == nil {
		return true
	}
	p.nReset.Add(1)
	done := false
	defer func() {
		if !done {
			p.closeSession(s)
		}
	}()
	err := s.resetter.ResetSession(ctx)
	done = true
	if errors.Is(err, driver.ErrBadConn) {
		p.nInvalid.Add(1)
		p.closeSession(s)
		return false
	}
	return true
}

// dialing is one dial in flight: its result goes to the caller that asked
// for it, or, if that caller gave up first, to the pool.
type dialing struct {
	done     chan struct{}
	state    atomic.Int32 // dialWaiting, dialAbandoned or dialDelivered
	s        *session
	err      error
	panicked any
}

const (
	dialWaiting int32 = iota
	dialAbandoned
	dialDelivered
)

// dial opens a new session, its place under max already counted in open.
// It dials on a goroutine of its own, with the caller's context values but
// not its cancellation, bounded by WithDialTimeout and by the pool's
// close: if ctx ends first, dial returns ctx's error at once and the
// session, when the dial succeeds, is kept idle for the next caller.
func (p *pool) dial(ctx context.Context) (*session, error) {
	p.nDials.Add(1)
	d := &dialing{done: make(chan struct{})}
	if ctx.Done() == nil {
		p.runDial(ctx, d) // nothing to give up on: dial here
	} else {
		go p.runDial(ctx, d)
		select {
		case <-d.done:
		case <-ctx.Done():
			if d.state.CompareAndSwap(dialWaiting, dialAbandoned) {
				return nil, ctx.Err()
			}
			<-d.done
		}
	}
	if d.panicked != nil {
		panic(d.panicked)
	}
	return d.s, d.err
}

func (p *pool) runDial(ctx context.Context, d *dialing) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.dialTimeout())
	stop := context.AfterFunc(p.ctx, cancel)
	defer func() {
		stop()
		cancel()
		if v := recover(); v != nil {
			d.panicked = v
			d.err = fmt.Errorf("bulkhead: the driver panicked while connecting: %v", v)
			p.slotFree()
		}
		p.deliver(d)
	}()
	ci, err := p.connector.Connect(dctx)
	if err != nil {
		p.nDialErrors.Add(1)
		p.slotFree()
		d.err = err
		return
	}
	d.s = newSession(ci)
	p.learn(d.s)
}

// deliver hands a finished dial to its caller, or to the pool if the
// caller gave up.
func (p *pool) deliver(d *dialing) {
	if d.state.CompareAndSwap(dialWaiting, dialDelivered) {
		close(d.done)
		return
	}
	switch {
	case d.panicked != nil:
		slog.Default().Error("bulkhead: the driver panicked while connecting, after the caller gave up", "panic", d.panicked)
	case d.s != nil:
		p.nKept.Add(1)
		p.put(d.s)
	}
}

func (p *pool) dialTimeout() time.Duration {
	if p.opt.dialTimeout > 0 {
		return p.opt.dialTimeout
	}
	return defaultDialTimeout
}

// learn records what the driver's connections look like from the first
// one dialed.
func (p *pool) learn(s *session) {
	if p.proto.Load() == nil {
		p.proto.CompareAndSwap(nil, &protoInfo{mask: s.mask(), checker: s.checker})
	}
}

// put takes back a session its holder is done with: deferred statement
// closes run, then it is closed if it is to be discarded, past its
// lifetime or invalid (the driver's Validator), or if the pool is closed
// or above max; else it goes to the first waiter, or to the top of the
// idle list.
func (p *pool) put(s *session) {
	now := time.Now()
	for {
		p.mu.Lock()
		pending := s.pending
		s.pending = nil
		p.mu.Unlock()
		if len(pending) == 0 {
			break
		}
		for _, si := range pending {
			closeStmt(si)
		}
	}
	if s.discard || p.tooOld(s, now) || !p.valid(s) {
		p.closeSession(s)
		return
	}
	p.mu.Lock()
	if len(s.pending) > 0 { // a close deferred meanwhile: run it too
		p.mu.Unlock()
		p.put(s)
		return
	}
	if p.closed || p.open > p.max {
		p.mu.Unlock()
		p.closeSession(s)
		return
	}
	if !p.grantLocked(s) {
		p.pushIdleLocked(s, now)
	}
	p.mu.Unlock()
}

// valid asks the driver's Validator, as database/sql does when a
// connection comes back to its pool. A panic closes the session and goes
// on up.
func (p *pool) valid(s *session) bool {
	if s.validator == nil {
		return true
	}
	done := false
	defer func() {
		if !done {
			p.closeSession(s)
		}
	}()
	ok := s.validator.IsValid()
	done = true
	if !ok {
		p.nInvalid.Add(1)
	}
	return ok
}

// closeStmt closes a statement whose session is free, ignoring a panic in
// the driver: it must not stop the session from being given back.
func closeStmt(si driver.Stmt) {
	defer func() { _ = recover() }()
	si.Close()
}

// closeStmtOn closes si, prepared on s, now if s is idle (taking it out of
// the idle list meanwhile), or when s is next given back if it is held.
func (p *pool) closeStmtOn(s *session, si driver.Stmt) {
	p.mu.Lock()
	switch s.state {
	case sessionIdle:
		p.unlinkLocked(s)
		p.mu.Unlock()
		closeStmt(si)
		p.put(s)
	case sessionBound:
		s.pending = append(s.pending, si)
		p.mu.Unlock()
	default: // closed: the statement went with it
		p.mu.Unlock()
	}
}

// closeSession closes s and frees its place under max.
func (p *pool) closeSession(s *session) {
	p.mu.Lock()
	if s.state == sessionClosed {
		p.mu.Unlock()
		return
	}
	if s.state == sessionIdle {
		p.unlinkLocked(s)
	}
	s.state = sessionClosed
	s.pending = nil
	s.gone.Store(true)
	p.mu.Unlock()
	defer p.slotFree()
	s.ci.Close()
}

// slotFree gives back a place under max: to the first waiter, who will
// dial, unless the pool is above max.
func (p *pool) slotFree() {
	p.mu.Lock()
	p.open--
	if p.open < p.max && !p.closed && p.wHead != nil {
		p.open++
		p.grantLocked(nil)
	}
	p.mu.Unlock()
}

func (p *pool) closeAll(ss []*session) {
	for _, s := range ss {
		p.closeSession(s)
	}
}

// setMax changes how many sessions may be open: waiters get the new
// places; idle sessions above the new max are closed.
func (p *pool) setMax(n int) {
	p.mu.Lock()
	p.max = n
	for p.open < p.max && p.wHead != nil && !p.closed {
		p.open++
		p.grantLocked(nil)
	}
	var extra []*session
	for over := p.open - p.max; over > 0 && p.bottom != nil; over-- {
		s := p.bottom
		p.unlinkLocked(s)
		extra = append(extra, s)
	}
	p.mu.Unlock()
	p.closeAll(extra)
}

// close closes the idle sessions and ends the dials in flight; sessions
// still bound are closed when they are given back, and callers waiting for
// one get ErrClosed.
func (p *pool) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	var idle []*session
	for p.top != nil {
		s := p.top
		p.unlinkLocked(s)
		idle = append(idle, s)
	}
	p.mu.Unlock()
	p.cancel()
	p.closeAll(idle)
}

// poolStats is what Stats reports of the pool.
type poolStats struct {
	open, idle, max, waiting int
}

func (p *pool) stats() poolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return poolStats{open: p.open, idle: p.idle, max: p.max, waiting: p.waiting}
}
