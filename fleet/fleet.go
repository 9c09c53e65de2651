// Package fleet shares one budget among the processes of a service: every
// member of a fleet, against the same PostgreSQL database, runs on its
// share of the fleet's MaxConcurrent (T) and MaxQueue, so that the whole
// fleet never runs more than T operations at once, through deploys,
// scale-outs and crashes.
//
//	m, err := fleet.Join("orders", inner, policy) // policy.MaxConcurrent is T
//	if err != nil {
//		return err
//	}
//	db := m.Gate().OpenDB()
//	defer db.Close() // leaves the fleet: the others take the share
//
// The coordination is the database's lock manager. The fleet has T slots,
// each a PostgreSQL session-level advisory lock; a member may run as many
// operations at once as it holds slots (Gate.Cap), so the sum over the
// fleet cannot exceed T whatever the members do: a slot is locked before
// a member's B grows, and unlocked only after its B shrank and the
// operations beyond it ended. Each member also holds a membership lock
// keyed by its id (a random 31-bit number), which is how the others count
// it. All these locks belong to one dedicated session per member: when the
// process dies, however it dies, the server ends that session and the
// locks are free at once.
//
// The statements a dead member had running go on until they end (the
// server sees a dead client only when it next reads from it), so its
// freed slots must not be reused before they end. Each server connection
// of the member's gate is tagged with its id before its first use, within
// the permits of the operation that first uses it: a shared advisory lock
// (Conns, id), held as long as the connection lives (Tagging,
// bulkhead.WithConnInit). The orphans are the busy connections of an id beyond the
// slots its member holds: all of them for an id with no membership lock.
// The targets are shares of T minus the orphans, and slots are locked
// under a fleet-wide transaction lock (Grow) by a statement that counts,
// in one reading of pg_locks, the slots held and the orphans, and takes no
// more than T minus both.
//
// Once per interval, and never on an operation's path, a member reads the
// fleet from pg_locks in one statement, works out its target (⌊T/n⌋ slots
// plus one for the first T mod n members in id order, or with Lending
// what the idle lend to the busy), then either gives back its excess or
// tries, without waiting, to lock free slots up to its target. A member
// joining a full fleet therefore starts with no share; the others give
// back their excess at their next round, and it takes it at its next,
// which comes after half an interval while it is short of its target:
// shares settle within two intervals. The queue, which holds no server
// connection, is split the same way without locks.
//
// A failed round (the query, or the coordination session lost) makes the
// share min(share, the fallback share); the session is dropped, and its
// locks freed, once the operations beyond the fallback ended, and a later
// round opens a new one.
//
// A member runs on its share only for a lease, 1.5 intervals from the
// start of its last successful round (bulkhead.Gate.CapUntil); past it, its
// gate falls to the fallback share by itself. A member whose coordination
// session ran no statement for 1.75 intervals (frozen, paused, cut off)
// has passed its lease: the first other member to read it so ends that
// session and its idle connections, which frees its slots. A member's
// coordination session ended under it frees its slots while the member
// still runs on them: each member holds an anchor lock on a second
// session, and nobody takes a slot while an anchor shows without its
// membership lock.
package fleet

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dbbulkhead/bulkhead"
)

// Defaults of the options.
const (
	DefaultInterval = time.Second
	DefaultFallback = 1
)

// ErrCoordination is matched (errors.Is) by every coordination failure
// reported in Stats.LastError and Event.Err.
var ErrCoordination = errors.New("bulkhead: fleet coordination failed")

type coordError struct{ err error }

func (e *coordError) Error() string   { return "bulkhead: fleet coordination failed: " + e.err.Error() }
func (e *coordError) Unwrap() []error { return []error{ErrCoordination, e.err} }

// Stats describes a member's part in its fleet.
type Stats struct {
	Name      string // the fleet's
	Total     int    // T: the fleet's MaxConcurrent (the gate's policy's)
	Instances int    // members alive at the last successful round
	Share     int    // slots this member holds (its B is at most this)
	Orphans   int    // at the last successful round, busy server connections beyond their member's slots (a killed member's, or one's without coordination): the shares leave room for them
	ID        int64  // this member's id: the second key of its membership lock and of its connections' tags
	Backend   int64  // the coordination session's backend pid (pg_stat_activity.pid), 0 between sessions
	Degraded  bool   // the last round failed: the share is at most the fallback
	Rounds    int64  // coordination rounds done
	Failures  int64  // rounds that failed
	Expired   int64  // other members' sessions this member ended because their lease had run out (frozen, paused or cut off)
	LastError error  // the last failed round's error, nil after a success
}

// Event reports a change of the member's share, or a failed round.
type Event struct {
	Fleet         string
	Instances     int   // as Stats.Instances
	MaxConcurrent int   // the share of B now in force
	MaxQueue      int   // the share of Q now in force
	Err           error // the round's error: the share was lowered to the fallback
}

// Option configures a member.
type Option func(*Member)

// Interval sets how often a member reads the fleet and adjusts its share:
// one statement on its coordination session per interval, plus one to
// lock or unlock slots when its share changes. DefaultInterval (1 s) by
// default; at least 10ms.
func Interval(d time.Duration) Option {
	return func(m *Member) {
		if d < 10*time.Millisecond {
			m.setErr("fleet.Interval(%v), want at least 10ms", d)
		}
		m.interval = d
	}
}

// Fallback sets the share of B a member keeps while its coordination
// fails, when it is less than the share it had (a failure never raises a
// share): DefaultFallback (1) by default, so that the service keeps a
// trickle of work through a coordination outage; 0 keeps the fleet within
// T even then, at the price of rejecting everything until the
// coordination is back.
func Fallback(b int) Option {
	return func(m *Member) {
		if b < 0 {
			m.setErr("fleet.Fallback(%d), want at least 0", b)
		}
		m.fallback = b
	}
}

// Coordinator sets where a member opens its coordination session, by
// default the inner connector. The session holds session-level advisory
// locks, so it must reach PostgreSQL itself, not a pooler in transaction
// mode such as PgBouncer's: point it at the server when the operations go
// through one.
func Coordinator(c driver.Connector) Option {
	return func(m *Member) {
		if c == nil {
			m.setErr("fleet.Coordinator(nil), want a connector")
		}
		m.conn = c
	}
}

// Lending makes a member lend: one that ran nothing since its last round
// keeps one slot of its fair share and lends the rest to the members that
// had operations waiting or rejected, still within T. The price is the way
// back: an idle member that gets busy again runs on its one slot until
// the borrowers give its share back, two to three intervals later. Every
// member of a fleet should set the same.
func Lending(on bool) Option { return func(m *Member) { m.lending = on } }

// Tagging sets whether a member tags each server connection of its gate
// with its id before its first use (one statement per connection, within
// the permits of the operation that first uses it: a shared advisory lock
// the connection holds as long as it lives), on by default.
// The tags let the others see the statements a killed member left running
// and leave room for them until they end. Turn it off only when the
// operations go through a pooler in transaction mode (PgBouncer's), where
// a session-level lock would stay on the pooler's server connection,
// shared by other clients.
func Tagging(on bool) Option { return func(m *Member) { m.noTags = !on } }

// OnChange sets a callback called, on the coordination goroutine, when the
// member's share changes or a round fails.
func OnChange(f func(Event)) Option { return func(m *Member) { m.onChange = f } }

// GateOptions passes options to the member's gate (bulkhead.New).
func GateOptions(opts ...bulkhead.Option) Option {
	return func(m *Member) { m.gateOpts = append(m.gateOpts, opts...) }
}

// NameFromEnv returns the fleet's name from BULKHEAD_FLEET: "" when it is
// unset, an error matching bulkhead.ErrInvalidPolicy when it is not a
// name.
func NameFromEnv() (string, error) {
	v, ok := os.LookupEnv("BULKHEAD_FLEET")
	if !ok {
		return "", nil
	}
	if !validName(v) {
		return "", fmt.Errorf("%w: BULKHEAD_FLEET=%q, want a fleet name of 1 to 64 of a-z, 0-9, _ and -", bulkhead.ErrInvalidPolicy, v)
	}
	return v, nil
}

// CheckName returns an error matching bulkhead.ErrInvalidPolicy, naming
// name, if it is not a fleet's name: 1 to 64 of a-z, 0-9, _ and -.
func CheckName(name string) error {
	if !validName(name) {
		return fmt.Errorf("%w: fleet name %q, want 1 to 64 of a-z, 0-9, _ and -", bulkhead.ErrInvalidPolicy, name)
	}
	return nil
}

func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// share is the part of the fleet's limits a member runs on; b holds only
// until until, the member's lease (zero: for good, b is within the
// fallback).
type share struct {
	b, q  int
	until time.Time
}

// Member is one process's part in a fleet budget: its gate, and the loop
// that keeps the gate's limits at the member's share. It is safe for
// concurrent use.
type Member struct {
	g        *bulkhead.Gate
	name     string
	keys     Keys
	id       atomic.Int64 // 1 to 2³¹−1
	interval time.Duration
	fallback int
	conn     driver.Connector
	lending  bool
	noTags   bool
	onChange func(Event)
	gateOpts []bulkhead.Option
	err      error // the first invalid option

	mu  sync.Mutex
	cur share // the share in force

	roundMu  sync.Mutex   // one round at a time
	newStore func() store // opens a coordination session: pgStore, or a test's
	store    store        // the session; nil between sessions
	joined   bool         // a session of this id joined once
	pid      int64        // the session's backend pid: the holder of its slots
	held     []int        // slots it holds, as the last read said
	seen     bulkhead.Stats
	fair     int  // the fair share at the last round
	stale    bool // a round failed with operations beyond the fallback running: drop the session once they end

	instances, orphans, rounds, failures, backend, expired atomic.Int64
	degraded, short                                        atomic.Bool // short: the last round left the share below its target
	lastErr                                                atomic.Pointer[error]

	quit chan struct{}
	done chan struct{}
	once sync.Once
}

func (m *Member) setErr(format string, args ...any) {
	if m.err == nil {
		m.err = fmt.Errorf("%w: "+format, append([]any{bulkhead.ErrInvalidPolicy}, args...)...)
	}
}

// Join makes the member of the fleet name for this process: a gate on
// inner whose policy's MaxConcurrent (T) and MaxQueue are the whole
// fleet's, run on this member's share, which starts at 0 and settles
// within two intervals (Sync waits for a first round). Every member of a
// fleet should have the same policy. The gate's Close leaves the fleet:
// the share goes to 0, and the coordination session, which holds the
// slots, is closed once no operation runs.
func Join(name string, inner driver.Connector, p bulkhead.Policy, opts ...Option) (*Member, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if inner == nil {
		return nil, errors.New("bulkhead: fleet: the inner connector is nil, want a driver.Connector")
	}
	m := &Member{name: name, keys: LockKeys(name), interval: DefaultInterval, fallback: DefaultFallback, conn: inner,
		quit: make(chan struct{}), done: make(chan struct{})}
	for _, o := range opts {
		o(m)
	}
	if m.err != nil {
		return nil, m.err
	}
	if m.id.Load() == 0 {
		m.id.Store(newID())
	}
	if m.newStore == nil {
		m.newStore = func() store { return &pgStore{conn: m.conn, keys: m.keys, interval: m.interval} }
	}
	return m, m.start(inner, p)
}

// start makes the gate, at a share of 0, and starts the loop.
func (m *Member) start(inner driver.Connector, p bulkhead.Policy) error {
	opts := m.gateOpts
	if !m.noTags {
		opts = append(opts[:len(opts):len(opts)], bulkhead.WithConnInit(m.tag))
	}
	g, err := bulkhead.New(&connector{inner: inner, m: m}, p, opts...)
	if err != nil {
		return err
	}
	m.g = g
	m.setShare(share{}, nil)
	go m.loop()
	return nil
}

// Gate returns the member's gate.
func (m *Member) Gate() *bulkhead.Gate { return m.g }

// Stats returns a snapshot of the member's part in the fleet.
func (m *Member) Stats() Stats {
	s := Stats{
		Name:      m.name,
		Total:     m.g.Policy().MaxConcurrent,
		Instances: int(m.instances.Load()),
		Share:     m.share().b,
		Orphans:   int(m.orphans.Load()),
		ID:        m.id.Load(),
		Backend:   m.backend.Load(),
		Degraded:  m.degraded.Load(),
		Rounds:    m.rounds.Load(),
		Failures:  m.failures.Load(),
		Expired:   m.expired.Load(),
	}
	if e := m.lastErr.Load(); e != nil {
		s.LastError = *e
	}
	return s
}

// Keys are the first keys of a fleet's PostgreSQL advisory locks
// (two-key form). In pg_locks they are the rows with locktype 'advisory',
// objsubid 2 and classid the key as an unsigned 32-bit number, objid the
// second key.
type Keys struct {
	Members int32 // (Members, id): each member's coordination session holds its own, exclusive
	Slots   int32 // (Slots, i), i from 0 to T−1: the slots, exclusive, held by the coordination sessions
	Conns   int32 // (Conns, id): every server connection a member's gate dialed holds one, shared (Tagging)
	Grow    int32 // (Grow, 0): a transaction-level lock that serializes the taking of slots
	Anchors int32 // (Anchors, id): each member's second session holds its own, shared: the member may be running while it has no membership lock
}

// LockKeys returns the keys of the fleet name's advisory locks: 32 bits of
// a hash of the name each, so that two fleets of one database whose names
// collide would share a budget, which a different name avoids.
func LockKeys(name string) Keys {
	return Keys{Members: key(name, "members"), Slots: key(name, "slots"), Conns: key(name, "conns"), Grow: key(name, "grow"), Anchors: key(name, "anchors")}
}

func key(name, what string) int32 {
	h := fnv.New32a()
	h.Write([]byte("bulkhead:" + name + ":" + what))
	return int32(h.Sum32())
}

// newID draws a member's id at random, so that no two live members are
// likely to draw the same (a join then fails, and the member draws again).
func newID() int64 { return 1 + rand.Int64N(math.MaxInt32) }

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
	return m.g.CapUntil(ctx, s.b, s.q, s.until, min(s.b, m.fallback))
}

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
		m.setShare(share{b: min(cur.b, m.fallback), q: cur.q}, err)
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
		m.store, m.pid, m.held, m.joined = st, pid, nil, true
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
	// The orphans run on slots their dead owner no longer holds: the
	// shares are of what is left.
	avail := max(0, t-v.orphans)
	target := targets(avail, v.members, m.lending)[rank]
	m.fair = targets(avail, v.members, false)[rank]
	q := tq / n
	if rank < tq%n {
		q++
	}
	m.held = m.held[:0]
	for s, pid := range v.slots {
		if pid == m.pid {
			m.held = append(m.held, s)
		}
	}
	slices.Sort(m.held)
	inRange := 0
	for _, s := range m.held {
		if s < t {
			inRange++
		}
	}
	m.short.Store(false)
	switch {
	case inRange > target || inRange < len(m.held):
		// Give back: first lower B, then wait for the operations beyond
		// it, then unlock (out-of-range slots first, then the highest).
		m.setShare(share{b: min(target, inRange), q: q, until: until}, nil)
		// Half an interval at most: a session idle for longer than
		// expiry is ended by the others.
		dctx, cancel := context.WithTimeout(ctx, m.interval/2)
		ok := m.drained(dctx)
		cancel()
		if !ok {
			return nil // the slots stay held; the next round gives them back
		}
		keep := min(target, inRange)
		var give []int
		kept := 0
		for _, s := range m.held {
			if s < t && kept < keep {
				kept++
				continue
			}
			give = append(give, s)
		}
		if err := m.store.unlock(ctx, give, state(keep)); err != nil {
			return err
		}
	case inRange < target:
		got, err := m.store.grow(ctx, t, target-inRange)
		if err != nil {
			return err
		}
		m.setShare(share{b: inRange + len(got), q: q, until: until}, nil)
		m.short.Store(inRange+len(got) < target)
	default:
		m.setShare(share{b: inRange, q: q, until: until}, nil)
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
	m.store, m.pid, m.held, m.stale = nil, 0, nil, false
	m.backend.Store(0)
}

// member is a member of the fleet as a round reads it: its id, its
// coordination session's backend pid, the state it published at its last
// round, and how long ago its session's last statement ended (0 while it
// runs one).
type member struct {
	id, pid int64
	state   string
	idle    time.Duration
}

// view is the fleet as a round reads it.
type view struct {
	members []member      // in id order
	slots   map[int]int64 // the holder's backend pid, by slot
	orphans int           // busy tagged connections beyond the slots of their id's member
	anchors map[int64]bool
	// fenced: the view shows a member that may run beyond the slots its
	// session holds: an anchor without membership (its coordination
	// session was ended under it), or a member whose published B exceeds
	// its slots (the server is freeing a dead session's locks). No slot
	// is taken while it does.
	fenced bool
}

// orphans counts, from the busy tagged connections by id, those beyond
// the slots of the id's member: all of an id without a member. A member's
// connections whose state cannot be seen (unknown, by id: another role's,
// without pg_read_all_stats) are not counted; a dead id's are.
func orphans(members []member, slots map[int]int64, busy, unknown map[int64]int) int {
	held := map[int64]int{} // by holder pid
	for _, pid := range slots {
		held[pid]++
	}
	n := 0
	for id, b := range busy {
		if i := slices.IndexFunc(members, func(m member) bool { return m.id == id }); i >= 0 {
			n += max(0, b-held[members[i].pid])
		} else {
			n += b
		}
	}
	for id, u := range unknown {
		if !slices.ContainsFunc(members, func(m member) bool { return m.id == id }) {
			n += u
		}
	}
	return n
}

// Loads a member publishes at each round (Lending uses them): idle (no
// operation since its last round), busy (some had to wait or were
// rejected: it could use more), active (neither).
const (
	loadIdle   = "idle"
	loadActive = "active"
	loadBusy   = "busy"
)

// load classifies this member's work since the last round. A member that
// runs on borrowed slots and still works stays busy, so that it does not
// give them back just because they sufficed.
func (m *Member) load(s bulkhead.Stats) string {
	prev := m.seen
	m.seen = s
	worked := s.Running > 0 || s.Admitted > prev.Admitted
	switch {
	case s.Waiting > 0 || s.WaitCount > prev.WaitCount || s.RejectedFull > prev.RejectedFull || s.RejectedTimeout > prev.RejectedTimeout || s.RejectedDeadline > prev.RejectedDeadline:
		return loadBusy
	case worked && s.MaxConcurrent > m.fair:
		return loadBusy
	case worked:
		return loadActive
	}
	return loadIdle
}

// memberLoad reads the load a member published; a member that published
// none yet counts as active.
func memberLoad(state string) string {
	for _, f := range strings.Fields(state) {
		if v, ok := strings.CutPrefix(f, "load="); ok && (v == loadIdle || v == loadBusy) {
			return v
		}
	}
	return loadActive
}

// targets returns each member's target share of t slots, members in id
// order. Without lending: ⌊t/n⌋, plus one for the first t mod n. With
// lending, active and busy members keep that fair share; an idle member
// keeps one slot of it and lends the rest, which goes to the busy members
// one slot at a time in id order; with no busy member nothing is lent.
// Every member computes the same targets from the same reading; readings
// a round apart may differ, which the slots' locks make harmless: a
// member only takes free slots, and no more than T minus the slots held
// and the orphans.
func targets(t int, members []member, lending bool) []int {
	n := len(members)
	out := make([]int, n)
	for i := range out {
		out[i] = t / n
		if i < t%n {
			out[i]++
		}
	}
	if !lending {
		return out
	}
	pool := 0
	var busy []int
	for i, m := range members {
		switch memberLoad(m.state) {
		case loadIdle:
			pool += out[i] - min(out[i], 1)
		case loadBusy:
			busy = append(busy, i)
		}
	}
	if len(busy) == 0 || pool == 0 {
		return out
	}
	for i, m := range members {
		if memberLoad(m.state) == loadIdle {
			out[i] = min(out[i], 1)
		}
	}
	for i := 0; pool > 0; i++ {
		out[busy[i%len(busy)]]++
		pool--
	}
	return out
}

// store is one coordination session: where the fleet's membership and
// slot locks live. pgStore is PostgreSQL's; the tests have an in-memory
// one.
type store interface {
	// join opens the session and takes the membership lock of id; it
	// returns the session's backend pid, which holds the slots it will
	// lock, or an error matching errIDTaken if another session holds
	// that membership lock. With reclaim, it also ends that session (the
	// member's own previous one): the next join finds the lock free.
	join(ctx context.Context, id int64, reclaim bool) (int64, error)
	// read returns the fleet: the members with the state each published
	// at its last round, which session holds each slot, and the orphans;
	// state is this member's, published for the others.
	read(ctx context.Context, state string) (view, error)
	// grow locks up to n free slots below t, without waiting for any, and
	// returns those it got: under the fleet's grow lock, it takes no more
	// than t minus the slots held and the orphans, as one reading finds
	// them. It takes none, without waiting, while another member holds
	// the grow lock.
	grow(ctx context.Context, t, n int) ([]int, error)
	// unlock frees slots and publishes state, the member's with its B
	// lowered, in the same statement.
	unlock(ctx context.Context, slots []int, state string) error
	// end ends the session pid of the member id, whose lease ran out,
	// and the idle server connections tagged with id, and reports whether
	// the session is gone: its locks are then free.
	end(ctx context.Context, pid, id int64) (bool, error)
	// leave ends the session, freeing its locks.
	leave()
}

// errIDTaken: another session holds the membership lock of the id.
var errIDTaken = errors.New("membership lock held by another session")

// pgStore keeps a fleet's locks as session-level advisory locks of one
// dedicated PostgreSQL session, keys (Members, id) and (Slots, index),
// read back from pg_locks with the connections' tags (Conns, id).
type pgStore struct {
	conn     driver.Connector
	keys     Keys
	interval time.Duration

	db     *sql.DB
	sess   *sql.Conn
	anchor *sql.Conn // holds (Anchors, id): it outlives sess if only sess is ended
}

func (p *pgStore) join(ctx context.Context, id int64, reclaim bool) (int64, error) {
	db := sql.OpenDB(noClose{p.conn})
	db.SetMaxIdleConns(1)
	sess, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return 0, err
	}
	var pid int64
	var ok bool
	// A grow's transaction left open by a member that stopped answering
	// (a pause, a network cut) would keep the others from growing until
	// the server ends the session: the server ends it after a round's
	// time instead, and the member's locks with it.
	idle := strconv.FormatInt(max(p.interval, 5*time.Second).Milliseconds(), 10)
	k := itoa32(p.keys.Members) + ", " + strconv.FormatInt(id, 10)
	err = sess.QueryRowContext(ctx, "SELECT pg_backend_pid(), pg_try_advisory_lock("+k+"), set_config('idle_in_transaction_session_timeout', '"+idle+"', false)").Scan(&pid, &ok, new(string))
	if err == nil && !ok {
		err = fmt.Errorf("%w: (%s)", errIDTaken, k)
		if reclaim {
			var ended int
			if rerr := sess.QueryRowContext(ctx, "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_locks"+
				" WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND pid <> pg_backend_pid()"+
				" AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"+
				" AND classid::int8 = "+uint32s(p.keys.Members)+" AND objid::int8 = "+strconv.FormatInt(id, 10)).Scan(&ended); rerr != nil {
				err = fmt.Errorf("%w; ending it: %w", err, rerr)
			} else {
				err = fmt.Errorf("%w: by this member's previous session, which the server had not ended; ended %d session(s), the next round joins", err, ended)
			}
		}
	}
	var anchor *sql.Conn
	if err == nil {
		anchor, err = db.Conn(ctx)
	}
	if err == nil {
		_, err = anchor.ExecContext(ctx, "SELECT pg_advisory_lock_shared("+itoa32(p.keys.Anchors)+", "+strconv.FormatInt(id, 10)+")")
		if err != nil {
			anchor.Close()
		}
	}
	if err != nil {
		sess.Close()
		db.Close()
		return 0, err
	}
	p.db, p.sess, p.anchor = db, sess, anchor
	return pid, nil
}

func (p *pgStore) leave() {
	// Unlock explicitly when the session still answers, so that the locks
	// are free before this returns, whatever database/sql then does with
	// the connection; closing it frees them anyway.
	ctx, cancel := context.WithTimeout(context.Background(), p.interval)
	_, _ = p.sess.ExecContext(ctx, "SELECT set_config('application_name', 'bulkhead fleet b=0', false), pg_advisory_unlock_all()")
	_, _ = p.anchor.ExecContext(ctx, "SELECT pg_advisory_unlock_all()")
	cancel()
	p.sess.Close()
	p.anchor.Close()
	p.db.Close()
}

// read looks at pg_locks once; the same statement sets the session's
// application_name to state, which pg_stat_activity then shows.
func (p *pgStore) read(ctx context.Context, state string) (view, error) {
	return p.scan(ctx, p.sess, state)
}

// queryer is a session or a transaction on it.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// scan reads the fleet's locks from pg_locks in one statement, and, if
// state is not empty, publishes it as the session's application_name.
func (p *pgStore) scan(ctx context.Context, q queryer, state string) (view, error) {
	var sb strings.Builder
	from := " FROM pg_locks l"
	if state != "" {
		sb.WriteString("WITH me AS (SELECT set_config('application_name', '" + state + "', false)) ")
		from = " FROM me, pg_locks l"
	}
	// An orphan is told by its state: a connection of a dead client that
	// is idle will never run again (the server ends it at its next read).
	// A state that cannot be seen (another role's session, without
	// pg_read_all_stats) is NULL.
	// idle is how long ago the session's last statement ended, while it
	// runs none (0 while it runs one, or cannot be seen).
	sb.WriteString("SELECT l.classid::int8, l.objid::int8, l.pid, coalesce(a.application_name, ''), coalesce(a.state, '')," +
		" coalesce(CASE WHEN a.state LIKE 'idle%' THEN (extract(epoch FROM statement_timestamp() - a.state_change) * 1000)::int8 END, 0)" +
		from + " LEFT JOIN pg_stat_activity a ON a.pid = l.pid" +
		" WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted" +
		" AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())" +
		" AND l.classid::int8 IN (" + uint32s(p.keys.Members, p.keys.Slots, p.keys.Conns, p.keys.Anchors) + ")")
	rows, err := q.QueryContext(ctx, sb.String())
	if err != nil {
		return view{}, err
	}
	defer rows.Close()
	v := view{slots: map[int]int64{}, anchors: map[int64]bool{}}
	busy, unknown := map[int64]int{}, map[int64]int{}
	for rows.Next() {
		var class, obj, pid, idle int64
		var app, state string
		if err := rows.Scan(&class, &obj, &pid, &app, &state, &idle); err != nil {
			return view{}, err
		}
		switch class {
		case int64(uint32(p.keys.Members)):
			v.members = append(v.members, member{id: obj, pid: pid, state: app, idle: time.Duration(idle) * time.Millisecond})
		case int64(uint32(p.keys.Slots)):
			v.slots[int(obj)] = pid
		case int64(uint32(p.keys.Anchors)):
			v.anchors[obj] = true
		default:
			switch state {
			case "idle":
			case "":
				unknown[obj]++
			default:
				busy[obj]++
			}
		}
	}
	if err := rows.Err(); err != nil {
		return view{}, err
	}
	slices.SortFunc(v.members, func(a, b member) int { return cmp.Compare(a.id, b.id) })
	v.orphans = orphans(v.members, v.slots, busy, unknown)
	v.fenced = fenced(v)
	return v, nil
}

// fenced reports whether v shows a member that may run beyond the slots
// its session holds (view.fenced).
func fenced(v view) bool {
	for id := range v.anchors {
		if !slices.ContainsFunc(v.members, func(m member) bool { return m.id == id }) {
			return true
		}
	}
	held := map[int64]int{}
	for _, pid := range v.slots {
		held[pid]++
	}
	for _, m := range v.members {
		if publishedB(m.state) > held[m.pid] {
			return true
		}
	}
	return false
}

// publishedB reads the B a member published with its state, 0 if none.
func publishedB(state string) int {
	for _, f := range strings.Fields(state) {
		if v, ok := strings.CutPrefix(f, "b="); ok {
			b, _ := strconv.Atoi(v)
			return b
		}
	}
	return 0
}

// grow takes slots in a transaction that first takes the fleet's grow
// lock: two members growing at once would each see room for the same
// orphans. It does not wait for the lock: the round is then short of its
// target, and the next comes after half an interval.
func (p *pgStore) grow(ctx context.Context, t, n int) ([]int, error) {
	tx, err := p.sess.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	var mine bool
	if err := tx.QueryRowContext(ctx, "SELECT pg_try_advisory_xact_lock("+itoa32(p.keys.Grow)+", 0)").Scan(&mine); err != nil || !mine {
		return nil, err
	}
	v, err := p.scan(ctx, tx, "")
	if err != nil {
		return nil, err
	}
	free := freeSlots(v, t, n)
	if len(free) == 0 {
		return nil, tx.Commit()
	}
	// Session-level locks taken in a transaction outlive it.
	rows, err := tx.QueryContext(ctx, "SELECT s FROM unnest(ARRAY["+join(free)+"]) AS s WHERE pg_try_advisory_lock("+itoa32(p.keys.Slots)+", s)")
	if err != nil {
		return nil, err
	}
	var got []int
	for rows.Next() {
		var s int
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return got, err
		}
		got = append(got, s)
	}
	if err := rows.Err(); err != nil {
		return got, err
	}
	return got, tx.Commit()
}

// freeSlots returns the slots to try to lock: up to n of those below t no
// session holds, and no more than t minus the slots held (any, even above
// t) and the orphans.
func freeSlots(v view, t, n int) []int {
	if v.fenced {
		return nil
	}
	n = min(n, t-len(v.slots)-v.orphans)
	var free []int
	for s := 0; s < t && len(free) < n; s++ {
		if _, taken := v.slots[s]; !taken {
			free = append(free, s)
		}
	}
	return free
}

func (p *pgStore) unlock(ctx context.Context, slots []int, state string) error {
	if len(slots) == 0 {
		return nil
	}
	_, err := p.sess.ExecContext(ctx, "SELECT set_config('application_name', '"+state+"', false), pg_advisory_unlock("+itoa32(p.keys.Slots)+", s) FROM unnest(ARRAY["+join(slots)+"]) AS s")
	return err
}

func (p *pgStore) end(ctx context.Context, pid, id int64) (bool, error) {
	var gone bool
	wait := strconv.FormatInt(min(p.interval, time.Second).Milliseconds(), 10)
	// Its anchor and idle connections go too: the anchor would fence the
	// fleet, and a statement the member sends on an idle connection when
	// it resumes then fails, unrun, and its retry meets the gate's check
	// of the lapsed lease.
	err := p.sess.QueryRowContext(ctx, "SELECT pg_terminate_backend("+strconv.FormatInt(pid, 10)+", "+wait+"),"+
		" (SELECT count(pg_terminate_backend(l.pid)) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"+
		" WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted"+
		" AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"+
		" AND (l.classid::int8 = "+uint32s(p.keys.Anchors)+" OR l.classid::int8 = "+uint32s(p.keys.Conns)+" AND a.state = 'idle')"+
		" AND l.objid::int8 = "+strconv.FormatInt(id, 10)+")").Scan(&gone, new(int64))
	return gone, err
}

func itoa32(v int32) string { return strconv.FormatInt(int64(v), 10) }

// uint32s lists keys as pg_locks shows them: unsigned.
func uint32s(keys ...int32) string {
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.FormatUint(uint64(uint32(k)), 10))
	}
	return b.String()
}

func join(xs []int) string {
	var b strings.Builder
	for i, x := range xs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(x))
	}
	return b.String()
}

// noClose hides the inner connector's Close from the coordination pool:
// closing that pool must not close the gate's connector.
type noClose struct{ c driver.Connector }

func (n noClose) Connect(ctx context.Context) (driver.Conn, error) { return n.c.Connect(ctx) }
func (n noClose) Driver() driver.Driver                            { return n.c.Driver() }

// tag marks a server connection of the member's gate as its own, before
// its first use (bulkhead.WithConnInit): a shared advisory lock (Conns,
// id) that the connection holds as long as it lives, so that the others
// count its work as orphans if this process dies while it runs. A
// connection that cannot be tagged is closed by the gate: its work would
// be invisible.
func (m *Member) tag(ctx context.Context, c driver.Conn) error {
	q := "SELECT pg_advisory_lock_shared(" + itoa32(m.keys.Conns) + ", " + strconv.FormatInt(m.id.Load(), 10) + ")"
	if err := execConn(ctx, c, q); err != nil {
		return fmt.Errorf("bulkhead: fleet %s: tagging a new server connection (fleet.Tagging): %w", m.name, err)
	}
	return nil
}

// connector is the member's gate's inner connector: closing it (the
// gate's Close) leaves the fleet, then closes the inner connector if it is
// an io.Closer.
type connector struct {
	inner driver.Connector
	m     *Member
}

func (c *connector) Connect(ctx context.Context) (driver.Conn, error) { return c.inner.Connect(ctx) }
func (c *connector) Driver() driver.Driver                            { return c.inner.Driver() }

func (c *connector) Close() error {
	c.m.leave()
	if cl, ok := c.inner.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

// execConn runs query, which takes no argument, on a driver connection.
func execConn(ctx context.Context, c driver.Conn, query string) error {
	if e, ok := c.(driver.ExecerContext); ok {
		_, err := e.ExecContext(ctx, query, nil)
		if err != driver.ErrSkip {
			return err
		}
	}
	var st driver.Stmt
	var err error
	if p, ok := c.(driver.ConnPrepareContext); ok {
		st, err = p.PrepareContext(ctx, query)
	} else {
		st, err = c.Prepare(query)
	}
	if err != nil {
		return err
	}
	defer st.Close()
	if e, ok := st.(driver.StmtExecContext); ok {
		_, err = e.ExecContext(ctx, nil)
	} else {
		_, err = st.Exec(nil) //lint:ignore SA1019 the driver's only way
	}
	return err
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
