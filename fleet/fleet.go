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
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"os"
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
	from  int // after a failed round: the share b fell from; its lease counts as run out
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
