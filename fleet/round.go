package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"time"

	"github.com/dbbulkhead/bulkhead"
)

// A member's rounds: once per interval it reads the fleet, works out its
// target (share.go), then gives back or takes slots; its share holds for
// a lease from the start of its last successful round.

// setShare puts s in force (without waiting for the operations beyond it)
// and reports it when it changed or err is set.
func (m *Member) setShare(s share, err error) {
	m.mu.Lock()
	changed := s.b != m.cur.b || s.q != m.cur.q
	m.cur = s
	m.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = m.capShare(ctx, s) // the cap is in force; the wait is drained's
	if m.onChange != nil && (changed || err != nil) {
		emit(m.onChange, Event{Fleet: m.name, Instances: int(m.instances.Load()), MaxConcurrent: s.b, MaxQueue: s.q, Err: err})
	}
}

func (m *Member) share() share {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cur
}

// drained waits until the operations running are within the share in
// force, or ctx ends; it reports which. In dry-run nothing is enforced and
// nothing is waited for.
func (m *Member) drained(ctx context.Context) bool {
	return m.capShare(ctx, m.share()) == nil
}

// capShare puts s in force on the gate: beyond its lease, the gate falls
// to the fallback share on its own.
func (m *Member) capShare(ctx context.Context, s share) error {
	if s.from > s.b { // the lease for from ended at the failure: the gate refuses with ErrLeaseExpired
		return m.g.CapUntil(ctx, s.from, s.q, leaseEnded, s.b)
	}
	return m.g.CapUntil(ctx, s.b, s.q, s.until, min(s.b, m.fallback))
}

// leaseEnded is a lease's end long past.
var leaseEnded = time.Unix(1, 0)

// drainedNow reports whether the operations running are within the share.
func (m *Member) drainedNow() bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return m.drained(ctx)
}

// loop runs a round at once, then one per interval, until leave.
func (m *Member) loop() {
	defer close(m.done)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-m.quit:
			return
		case <-t.C:
		}
		// A round has at least 5 s, a dial's time: a busy server may
		// answer a join or the round's statement slower than a short
		// interval, and a round cut off by its context is a failure.
		ctx, cancel := context.WithTimeout(context.Background(), max(m.interval, 5*time.Second))
		m.Sync(ctx) // its error is in the stats and events
		cancel()
		// Short of its target, the member waits for the others to give
		// back slots: it looks again after half an interval, so that a
		// give-back that landed just after its read does not cost it a
		// whole interval more.
		next := m.interval
		if m.short.Load() {
			next = m.interval / 2
		}
		t.Reset(next)
	}
}

// leave ends the loop, then leaves the fleet: the share goes to zero and
// the session that holds the slots is closed, which frees them, once no
// operation runs: at once if none does, else from a goroutine that waits
// for the last one to end.
func (m *Member) leave() {
	m.once.Do(func() {
		close(m.quit)
		<-m.done
		m.roundMu.Lock()
		m.setShare(share{}, nil)
		if m.drainedNow() {
			m.dropSession()
			m.roundMu.Unlock()
			return
		}
		go func() {
			defer m.roundMu.Unlock()
			m.drained(context.Background())
			m.dropSession()
		}()
	})
}

// Sync runs one coordination round now, beside those the loop runs once
// per interval, and returns its error, which matches ErrCoordination (or
// bulkhead.ErrClosed once the gate is closed). A process may call it at
// start-up to wait for its first share, and tests to step the fleet.
func (m *Member) Sync(ctx context.Context) error {
	select {
	case <-m.quit:
		return bulkhead.ErrClosed
	default:
	}
	m.roundMu.Lock()
	defer m.roundMu.Unlock()
	select {
	case <-m.quit:
		return bulkhead.ErrClosed
	default:
	}
	m.rounds.Add(1)
	err := m.round(ctx)
	if err != nil {
		err = &coordError{err: err}
		m.failures.Add(1)
		m.lastErr.Store(&err)
		m.degraded.Store(true)
		cur := m.share()
		m.setShare(share{b: min(cur.b, m.fallback), q: cur.q, from: max(cur.b, cur.from)}, err)
		// The session may still be alive and hold slots: it is closed
		// only once the operations beyond the fallback ended (here, or at
		// a later round).
		if m.store != nil && m.drainedNow() {
			m.dropSession()
		} else if m.store != nil {
			m.stale = true
		}
		return err
	}
	m.lastErr.Store(nil)
	m.degraded.Store(false)
	return nil
}

func (m *Member) round(ctx context.Context) error {
	// The lease this round renews starts before it reads: the others
	// count its expiry from the end of its last statement.
	until := time.Now().Add(m.lease())
	if m.stale {
		if !m.drained(ctx) {
			return errors.New("operations beyond the fallback share still run: the failed session, and its slots, are kept until they end")
		}
		m.dropSession()
	}
	if m.store == nil {
		st := m.newStore()
		// A member that joined before keeps its id, and reclaims it if a
		// session still holds it: its own previous one, which the server
		// has not ended yet (a network cut), and its connections are
		// tagged with it. One that never joined draws again: another
		// member drew the same id.
		pid, err := st.join(ctx, m.id.Load(), m.joined)
		if err != nil {
			if errors.Is(err, errIDTaken) && !m.joined {
				m.id.Store(newID())
			}
			return err
		}
		m.store, m.pid, m.joined = st, pid, true
		m.backend.Store(pid)
	}
	p := m.g.Policy()
	gs := m.g.Stats()
	load := m.load(gs)
	state := func(b int) string {
		return fmt.Sprintf("bulkhead fleet t=%d b=%d q=%d running=%d waiting=%d load=%s", p.MaxConcurrent, b, gs.MaxQueue, gs.Running, gs.Waiting, load)
	}
	// The B it publishes is what it runs on its slots: none while it
	// runs on the fallback (view.fenced).
	pub := gs.MaxConcurrent
	if m.degraded.Load() {
		pub = 0
	}
	v, err := m.store.read(ctx, state(pub))
	if err != nil {
		return err
	}
	id := m.id.Load()
	m.endExpired(ctx, &v, id)
	rank := slices.IndexFunc(v.members, func(mm member) bool { return mm.id == id })
	if rank < 0 {
		return fmt.Errorf("this member's membership lock (id %d, session pid %d) is gone", id, m.pid)
	}
	if !v.anchors[id] {
		return fmt.Errorf("this member's anchor lock (id %d) is gone", id)
	}
	v.members[rank].state = state(pub) // as the others will read it
	t, tq, n := p.MaxConcurrent, p.MaxQueue, len(v.members)
	m.instances.Store(int64(n))
	m.orphans.Store(int64(v.orphans))
	target := targets(t, v.orphans, v.members, m.lending)[rank]
	m.fair = targets(t, v.orphans, v.members, false)[rank]
	q := fairShare(tq, n, rank)
	keep, give := giveBack(heldBy(v.slots, m.pid), t, target)
	m.short.Store(false)
	switch {
	case len(give) > 0:
		// Give back: first lower B, then wait for the operations beyond
		// it, then unlock.
		m.setShare(share{b: keep, q: q, until: until}, nil)
		// Half an interval at most: a session idle for longer than
		// expiry is ended by the others.
		dctx, cancel := context.WithTimeout(ctx, m.interval/2)
		ok := m.drained(dctx)
		cancel()
		if !ok {
			return nil // the slots stay held; the next round gives them back
		}
		if err := m.store.unlock(ctx, give, state(keep)); err != nil {
			return err
		}
	case keep < target:
		got, err := m.store.grow(ctx, t, target-keep)
		if err != nil {
			return err
		}
		m.setShare(share{b: keep + len(got), q: q, until: until}, nil)
		m.short.Store(keep+len(got) < target)
	default:
		m.setShare(share{b: keep, q: q, until: until}, nil)
	}
	return nil
}

// endExpired ends the sessions of the members of v whose leases surely
// ran out (frozen, paused, cut off: their last statement ended longer ago
// than Expiry), which frees their slots, and leaves them out of v.
func (m *Member) endExpired(ctx context.Context, v *view, self int64) {
	v.members = slices.DeleteFunc(v.members, func(mm member) bool {
		if mm.id == self || mm.idle <= m.expiry() {
			return false
		}
		gone, err := m.store.end(ctx, mm.pid, mm.id)
		if gone && err == nil {
			m.expired.Add(1)
		}
		return gone && err == nil
	})
}

// lease is how long a member runs on its share after the start of its
// last successful round; expiry, longer by a quarter of an interval, is
// how long after a member's last statement the others end its session.
func (m *Member) lease() time.Duration  { return m.interval * 3 / 2 }
func (m *Member) expiry() time.Duration { return m.interval*3/2 + m.interval/4 }

// dropSession closes the coordination session: the server frees its
// locks.
func (m *Member) dropSession() {
	if m.store == nil {
		return
	}
	m.store.leave()
	m.store, m.pid, m.stale = nil, 0, false
	m.backend.Store(0)
}

// load classifies this member's work since the last round (loadOf).
func (m *Member) load(s bulkhead.Stats) string {
	prev := m.seen
	m.seen = s
	return loadOf(prev, s, m.fair)
}

// emit calls OnChange; a panic in it is logged and recovered: it would
// otherwise end the coordination loop.
func emit(f func(Event), e Event) {
	defer func() {
		if v := recover(); v != nil {
			slog.Default().Error("bulkhead: fleet event callback panicked", "fleet", e.Fleet, "panic", v, "stack", string(debug.Stack()))
		}
	}()
	f(e)
}
