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
// once it holds its permits: the first idle one in the order they were
// opened, whichever logical connection had it before (so the same few
// sessions carry the load, their server backends warm, while the others
// stay idle and age out); it gives the session back
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
//
// Concurrency: a session's state (bound, idle, closed) is one atomic word,
// so that taking an idle session and giving it back need no lock: the
// first idle one in the list of all sessions is taken by compare-and-swap.
// The pool's mu
// guards what changes rarely: the count of open sessions, the list of all
// of them (copied on write), and the callers waiting for one.

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

	state     atomic.Int32 // sessionBound, sessionIdle or sessionClosed
	idleSince atomic.Int64 // unix nanoseconds; kept only with WithConnMaxIdleTime
	// pending are statement closes deferred until the session is free: a
	// lock-free stack, drained by whoever holds the session.
	pending atomic.Pointer[pendingClose]

	// Owned by whoever holds the session: the logical connection bound
	// to it, or the pool while it is idle. Handing it over is a
	// compare-and-swap of state.
	used     bool   // bound before: reset before it is bound again
	discard  bool   // close it instead of keeping it when it is given back
	untagged bool   // a fleet's tag (pool.tag) has not run on it yet: it runs before its first operation (conn.tagFor)
	checked  uint64 // the pool's deadEpoch when it was last known alive
}

const (
	sessionBound  int32 = iota // held by a logical connection (or by the pool handing it over)
	sessionIdle                // free to take
	sessionClosed              // closed: statements prepared on it went with it
)

type pendingClose struct {
	si   driver.Stmt
	next *pendingClose
}

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

// gone reports whether s was closed.
func (s *session) gone() bool { return s.state.Load() == sessionClosed }

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
	tag       func(context.Context, driver.Conn) error // set before the first dial: a fleet's tag (fleet.tag), run on each session before its first operation

	ctx    context.Context // cancelled by close: ends the dials in flight
	cancel context.CancelFunc
	done   chan struct{} // closed by close

	all     atomic.Pointer[[]*session] // the open sessions in the order they were opened; replaced, never changed, under mu
	waiting atomic.Int64               // callers waiting (or about to) for a session: put looks for them
	open    atomic.Int64               // sessions open or being dialed; changed under mu
	max     atomic.Int64               // changed under mu
	closed  atomic.Bool                // set under mu

	mu           sync.Mutex
	wHead, wTail *connWaiter

	// proto describes the driver's connections once one was dialed: the
	// interfaces a logical connection offers, and a NamedValueChecker for
	// the arguments of an operation that has no session yet.
	proto    atomic.Pointer[protoInfo]
	learning chan struct{} // one dial at a time learns proto (Gate.learn)

	// deadEpoch counts the sessions found dead (the driver said
	// driver.ErrBadConn, or its Validator said no): when one dies, the
	// others idle since may have died with it (a server restart), so each
	// is pinged before its next use (see ready).
	deadEpoch atomic.Uint64

	nDials, nDialErrors, nKept, nInvalid atomic.Int64
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
	p := &pool{connector: connector, opt: opt, ctx: ctx, cancel: cancel, done: make(chan struct{}), learning: make(chan struct{}, 1)}
	p.max.Store(int64(max))
	p.all.Store(&[]*session{})
	return p
}

// errNoSession: max sessions were open and none came back within the wait.
var errNoSession = errors.New("bulkhead: no session")

// take takes s if it is idle.
func (p *pool) take(s *session) bool {
	return s.state.Load() == sessionIdle && s.state.CompareAndSwap(sessionIdle, sessionBound)
}

// takeFirst takes the first idle session in the order they were opened,
// closing on the way those idle longer than WithConnMaxIdleTime allows. It
// returns nil if none is idle.
//
// Taking the first rather than the most recently given back needs no
// shared counter on the way back (put), and keeps the load on the fewest
// sessions all the same: those opened first are taken whenever they are
// idle, so the later ones stay idle while the load needs fewer.
func (p *pool) takeFirst() *session {
	var now int64
	for _, s := range *p.all.Load() {
		if s.state.Load() != sessionIdle || !p.take(s) {
			continue
		}
		if p.opt.maxIdleTime > 0 {
			if now == 0 {
				now = time.Now().UnixNano()
			}
			if now-s.idleSince.Load() > int64(p.opt.maxIdleTime) {
				p.closeSession(s)
				continue
			}
		}
		return s
	}
	return nil
}

// get returns a session for a logical connection that has none (after
// conn.bind found no idle one at once): the first idle one (takeFirst);
// else a new one if fewer than max are open (or unbounded, in
// dry-run); else the first one given back within wait (errNoSession after
// that). A session taken idle is reset first, and closed and passed over
// when the driver says it is bad or it is past its lifetime.
func (p *pool) get(ctx context.Context, wait time.Duration, unbounded bool) (*session, error) {
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
		if p.closed.Load() {
			return nil, ErrClosed
		}
		if s := p.takeFirst(); s != nil {
			if p.ready(ctx, s) {
				return s, nil
			}
			continue
		}

		p.mu.Lock()
		if p.closed.Load() {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		// Announce the wait before looking again: a session given back
		// from now on sees it and comes through mu.
		p.waiting.Add(1)
		if s := p.takeFirst(); s != nil {
			p.waiting.Add(-1)
			p.mu.Unlock()
			if p.ready(ctx, s) {
				return s, nil
			}
			continue
		}
		if p.open.Load() < p.max.Load() || unbounded {
			p.open.Add(1)
			p.waiting.Add(-1)
			p.mu.Unlock()
			return p.dial(ctx)
		}
		if timer == nil {
			deadline = time.Now().Add(wait)
		}
		left := time.Until(deadline)
		if left <= 0 {
			p.waiting.Add(-1)
			p.mu.Unlock()
			return nil, errNoSession
		}
		w := &connWaiter{ready: make(chan struct{})}
		p.pushWaiterLocked(w)
		p.mu.Unlock()
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
		if p.ready(ctx, w.s) {
			return w.s, nil
		}
		// The session handed over was bad: look again, within the same
		// deadline (the timer runs on).
	}
}

// ready prepares s, just taken, for a new checkout: closed if it is past
// its lifetime; pinged (the driver's Pinger) if another session died since
// s was last known alive; then reset with the driver's SessionResetter, as
// database/sql does when it reuses a pooled connection. It reports whether
// s can be used; if not, s was closed.
//
// The ping after a death is the gate's own: database/sql finds each stale
// connection after a server restart by failing an operation on it (pgx
// pings only connections idle for more than a second); the gate lets the
// first failure warn the others.
func (p *pool) ready(ctx context.Context, s *session) bool {
	if p.opt.maxLifetime > 0 && time.Since(s.created) > p.opt.maxLifetime {
		p.closeSession(s)
		return false
	}
	if epoch := p.deadEpoch.Load(); s.checked != epoch {
		if s.pinger != nil {
			if err := p.ping(ctx, s); err != nil {
				if ctx.Err() == nil {
					p.nInvalid.Add(1)
					p.closeDead(s)
				} else {
					p.closeSession(s)
				}
				return false
			}
		}
		s.checked = epoch
	}
	return p.reset(ctx, s)
}

// ping runs the driver's Pinger on s, held by the caller. A panic closes
// s and goes on up.
func (p *pool) ping(ctx context.Context, s *session) error {
	done := false
	defer func() {
		if !done {
			p.closeSession(s)
		}
	}()
	err := s.pinger.Ping(ctx)
	done = true
	return err
}

// closeDead closes s, which the driver found dead, and makes the idle
// sessions suspect.
func (p *pool) closeDead(s *session) {
	p.deadEpoch.Add(1)
	p.closeSession(s)
}

func (p *pool) pushWaiterLocked(w *connWaiter) {
	w.prev = p.wTail
	if p.wTail != nil {
		p.wTail.next = w
	} else {
		p.wHead = w
	}
	p.wTail = w
}

// removeWaiterLocked takes w out of the queue and the count of waiters.
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
	p.waiting.Add(-1)
}

// grantLocked hands s, held by the caller (or, with s nil, a place under
// max already counted in open), to the first waiter, if any.
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

// reset prepares s, taken idle, for a new checkout with the driver's
// SessionResetter. A session the driver calls bad (driver.ErrBadConn) is
// closed and false returned; other errors are ignored, as database/sql
// ignores them. A panic closes the session and goes on up.
func (p *pool) reset(ctx context.Context, s *session) bool {
	if !s.used || s.resetter == nil {
		return true
	}
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
		p.closeDead(s)
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
	s := newSession(ci)
	s.checked = p.deadEpoch.Load()
	s.untagged = p.tag != nil
	p.mu.Lock()
	all := append(append(make([]*session, 0, len(*p.all.Load())+1), *p.all.Load()...), s)
	p.all.Store(&all)
	p.mu.Unlock()
	d.s = s
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

// learn records what the driver's connections look like from s, the
// first one dialed, once it is idle (Gate.learn): a logical connection
// made after that finds it.
func (p *pool) learn(s *session) {
	if p.proto.Load() == nil {
		p.proto.CompareAndSwap(nil, &protoInfo{mask: s.mask(), checker: s.checker})
	}
}

// put takes back a session its holder is done with: it is closed if it is
// to be discarded, past its lifetime or invalid (the driver's Validator),
// or if the pool is closed or above max; else deferred statement closes
// run, and it goes to the first waiter or becomes idle.
func (p *pool) put(s *session) {
	p.drain(s)
	if !p.valid(s) {
		p.closeDead(s)
		return
	}
	if s.discard || (p.opt.maxLifetime > 0 && time.Since(s.created) > p.opt.maxLifetime) ||
		p.closed.Load() || p.open.Load() > p.max.Load() {
		p.closeSession(s)
		return
	}
	if p.opt.maxIdleTime > 0 {
		s.idleSince.Store(time.Now().UnixNano())
	}
	s.state.Store(sessionIdle)
	// A statement close deferred meanwhile, or a caller waiting: both
	// looked at the state before it became idle, so they are seen here
	// (or they see it idle).
	if s.pending.Load() != nil && p.take(s) {
		p.put(s)
		return
	}
	if p.waiting.Load() > 0 || p.closed.Load() {
		p.mu.Lock()
		if p.closed.Load() {
			p.mu.Unlock()
			if p.take(s) {
				p.closeSession(s)
			}
			return
		}
		if p.wHead != nil && p.take(s) {
			p.grantLocked(s)
		}
		p.mu.Unlock()
	}
}

// drain runs the statement closes deferred on s, held by the caller.
func (p *pool) drain(s *session) {
	for s.pending.Load() != nil {
		for pc := s.pending.Swap(nil); pc != nil; pc = pc.next {
			closeStmt(pc.si)
		}
	}
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

// closeStmtOn closes si, prepared on s, now if s is idle (taking it
// meanwhile), or when its holder gives it back.
func (p *pool) closeStmtOn(s *session, si driver.Stmt) {
	pc := &pendingClose{si: si}
	for {
		old := s.pending.Load()
		pc.next = old
		if s.pending.CompareAndSwap(old, pc) {
			break
		}
	}
	// If s is idle now, its holder gave it back before seeing the close:
	// take it and run the closes (put checks pending again).
	if p.take(s) {
		p.put(s)
	}
}

// closeSession closes s, held by the caller, and frees its place under
// max.
func (p *pool) closeSession(s *session) {
	if s.state.Swap(sessionClosed) == sessionClosed {
		return
	}
	s.pending.Store(nil) // the statements go with the session
	p.mu.Lock()
	all := make([]*session, 0, len(*p.all.Load()))
	for _, o := range *p.all.Load() {
		if o != s {
			all = append(all, o)
		}
	}
	p.all.Store(&all)
	p.mu.Unlock()
	defer p.slotFree()
	s.ci.Close()
}

// slotFree gives back a place under max: to the first waiter, who will
// dial, unless the pool is above max.
func (p *pool) slotFree() {
	p.mu.Lock()
	p.open.Add(-1)
	if p.open.Load() < p.max.Load() && !p.closed.Load() && p.wHead != nil {
		p.open.Add(1)
		p.grantLocked(nil)
	}
	p.mu.Unlock()
}

// takeLast takes the last idle session in the order they were opened (the
// one takeFirst would take last), or nil.
func (p *pool) takeLast() *session {
	all := *p.all.Load()
	for i := len(all) - 1; i >= 0; i-- {
		if p.take(all[i]) {
			return all[i]
		}
	}
	return nil
}

// setMax changes how many sessions may be open: waiters get the new
// places; idle sessions above the new max are closed.
func (p *pool) setMax(n int) {
	p.mu.Lock()
	p.max.Store(int64(n))
	for p.open.Load() < p.max.Load() && p.wHead != nil && !p.closed.Load() {
		p.open.Add(1)
		p.grantLocked(nil)
	}
	over := p.open.Load() - p.max.Load()
	p.mu.Unlock()
	for ; over > 0; over-- {
		s := p.takeLast()
		if s == nil {
			break
		}
		p.closeSession(s)
	}
}

// close closes the idle sessions and ends the dials in flight; sessions
// still bound are closed when they are given back, and callers waiting for
// one get ErrClosed.
func (p *pool) close() {
	p.mu.Lock()
	if p.closed.Load() {
		p.mu.Unlock()
		return
	}
	p.closed.Store(true)
	close(p.done)
	p.mu.Unlock()
	p.cancel()
	for _, s := range *p.all.Load() {
		if p.take(s) {
			p.closeSession(s)
		}
	}
}

// poolStats is what Stats reports of the pool.
type poolStats struct {
	open, idle, max, waiting int
}

func (p *pool) stats() poolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for w := p.wHead; w != nil; w = w.next {
		n++
	}
	idle := 0
	for _, s := range *p.all.Load() {
		if s.state.Load() == sessionIdle {
			idle++
		}
	}
	return poolStats{open: int(p.open.Load()), idle: idle, max: int(p.max.Load()), waiting: n}
}
