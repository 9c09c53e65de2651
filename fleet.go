package bulkhead

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// A fleet budget: every process whose policy names the same Fleet shares
// the policy's MaxConcurrent (T) and MaxQueue against one PostgreSQL
// database, and each runs on its share.
//
// The coordination is the database's lock manager. The fleet has T slots,
// each a PostgreSQL session-level advisory lock; a process may run as many
// operations at once as it holds slots, so the sum over the fleet cannot
// exceed T whatever the processes do: a slot is locked before the process's
// B grows, and unlocked only after B shrank and the operations beyond it
// ended. Each process also holds a membership lock keyed by its id (a
// random 31-bit number drawn when the gate is made), which is how the
// others count it. All these locks belong to one dedicated session per
// process: when the process dies, however it dies, the server ends that
// session and the locks are free at once.
//
// The statements a dead process had running go on until they end (the
// server sees the dead client only when it next reads from it), so its
// freed slots must not be reused before they end. Each server connection
// of the gate is tagged with the process's id before its first operation:
// a shared advisory lock (Conns, id), held as long as the connection lives
// (WithFleetTagging; conn.tagFor).
//
// The orphans are the busy (not idle) connections of an id beyond the
// slots its member holds: all of them when the id has no membership lock
// (a process that died, or that lost its coordination session and runs on
// its fallback share), the excess while a dying session's locks are being
// released (the server frees them one lock partition at a time, so a
// reading may find its slots free and its membership lock still held).
// The targets are shares of T minus the orphans, and slots are locked
// under a fleet-wide transaction lock (Grow) by a statement that counts,
// in one reading of pg_locks, the slots held and the orphans, and takes no
// more than T minus both: held slots plus orphans never exceed T, since a
// process runs no more than it holds, and whatever it frees as it dies
// reappears as orphans, at most as many.
//
// Once per interval (WithFleetInterval), and never on an operation's
// path, a process reads the fleet from pg_locks in one statement, works
// out its target (fleetTargets of T minus the orphans: ⌊T/n⌋ slots plus
// one for the first T mod n members in id order, or with WithFleetLending
// what the idle lend to the busy), and then either gives back its excess,
// or tries (without waiting for a slot) to lock free slots up to its
// target. A process joining a full fleet therefore starts with no share;
// the others give back their excess at their next round, and it takes it
// at its next, which comes after half an interval while it is short of its
// target: within two intervals. The queue, which holds no server
// connection, is split the same way without locks.
//
// A failed round (the query, or the coordination session lost) makes the
// share min(share, the fallback share; WithFleetFallback, default 1); the
// session is dropped, and its locks freed, once the operations beyond the
// fallback ended, and a later round starts a new one. Stats.Fleet and
// Events.OnFleet say so.

// FleetStats describes this process's part of a fleet budget.
type FleetStats struct {
	Name      string // Policy.Fleet
	Total     int    // T: the fleet's MaxConcurrent (the policy's)
	Instances int    // processes of the fleet alive at the last successful round
	Share     int    // slots this process holds (its B is at most this)
	Orphans   int    // at the last successful round, busy server connections beyond their process's slots (a killed process's, or one's without coordination): the shares leave room for them
	ID        int64  // this process's id in the fleet: the second key of its membership lock and of its connections' tags
	Backend   int64  // the coordination session's backend pid (pg_stat_activity.pid), 0 between sessions
	Degraded  bool   // the last round failed: the share is at most the fallback
	Rounds    int64  // coordination rounds done
	Failures  int64  // rounds that failed
	LastError error  // the last failed round's error, nil after a success
}

// FleetEvent reports a change of this process's fleet share, or a failed
// coordination round.
type FleetEvent struct {
	Fleet         string
	Instances     int   // as FleetStats.Instances
	MaxConcurrent int   // the share of B now in force
	MaxQueue      int   // the share of Q now in force
	Err           error // the round's error: the share was lowered to the fallback
}

// Defaults of a fleet's options.
const (
	DefaultFleetInterval = time.Second
	DefaultFleetFallback = 1
)

// ErrFleet is matched (errors.Is) by every coordination failure reported
// in FleetStats.LastError and FleetEvent.Err.
var ErrFleet = errors.New("bulkhead: fleet coordination failed")

type fleetError struct{ err error }

func (e *fleetError) Error() string { return "bulkhead: fleet coordination failed: " + e.err.Error() }
func (e *fleetError) Unwrap() []error {
	return []error{ErrFleet, e.err}
}

// share is the part of the fleet's limits a process runs on.
type share struct{ b, q int }

type fleet struct {
	g        *Gate
	name     string
	keys     FleetKeys
	id       atomic.Int64 // the process's id in the fleet: 1 to 2³¹−1
	joined   bool         // a session of this id joined once (under roundMu)
	interval time.Duration
	fallback int
	conn     driver.Connector

	// cur is the share in force; set under g.mu (apply reads it there).
	cur share

	roundMu  sync.Mutex        // one round at a time
	newStore func() fleetStore // opens a coordination session: pgStore, or a test's
	store    fleetStore        // the session; nil between sessions
	pid      int64             // its backend pid: the holder of its slots
	held     []int             // slots it holds, as the last read said
	lending  bool              // WithFleetLending
	seen     Stats             // the counters at the last round (load)
	fair     int               // the fair share at the last round
	stale    bool              // a round failed with operations beyond the fallback running: drop the session once they end

	instances, orphans, rounds, failures, backend atomic.Int64
	degraded, short                               atomic.Bool // short: the last round left the share below its target
	lastErr                                       atomic.Pointer[error]

	quit    chan struct{}
	done    chan struct{}
	started bool
	once    sync.Once
}

func newFleet(g *Gate, name string) *fleet {
	f := &fleet{
		g:        g,
		name:     name,
		keys:     FleetLockKeys(name),
		interval: g.opt.fleetInterval,
		fallback: DefaultFleetFallback,
		conn:     g.opt.fleetConn,
		quit:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	if f.interval <= 0 {
		f.interval = DefaultFleetInterval
	}
	if g.opt.fleetFallback != nil {
		f.fallback = *g.opt.fleetFallback
	}
	if f.conn == nil {
		f.conn = g.inner
	}
	f.lending = g.opt.fleetLending
	f.id.Store(newFleetID())
	if g.opt.fleetID != 0 {
		f.id.Store(g.opt.fleetID)
	}
	f.newStore = func() fleetStore { return &pgStore{conn: f.conn, keys: f.keys, interval: f.interval} }
	if g.opt.fleetStore != nil {
		f.newStore = g.opt.fleetStore
	}
	return f
}

// FleetKeys are the first keys of a fleet's PostgreSQL advisory locks
// (two-key form). In pg_locks they are the rows with locktype 'advisory',
// objsubid 2 and classid the key as an unsigned 32-bit number, objid the
// second key; `bulkhead budget --fleet` reads them.
type FleetKeys struct {
	Members int32 // (Members, id): each member's coordination session holds its own, exclusive
	Slots   int32 // (Slots, i), i from 0 to T−1: the slots, exclusive, held by the coordination sessions
	Conns   int32 // (Conns, id): every server connection a member's gate dialed holds one, shared (WithFleetTagging)
	Grow    int32 // (Grow, 0): a transaction-level lock that serializes the taking of slots
}

// FleetLockKeys returns the keys of the fleet name's advisory locks: 32
// bits of a hash of the name each, so that two fleets of one database
// whose names collide would share a budget, which a different name
// avoids.
func FleetLockKeys(name string) FleetKeys {
	return FleetKeys{Members: fleetKey(name, "members"), Slots: fleetKey(name, "slots"), Conns: fleetKey(name, "conns"), Grow: fleetKey(name, "grow")}
}

// newFleetID draws a process's id in a fleet: at random, so that no two
// live processes are likely to draw the same (a join then fails, and the
// process draws again).
func newFleetID() int64 { return 1 + rand.Int64N(math.MaxInt32) }

// fleetKey is the first key of a fleet's advisory locks: 32 bits of a hash
// of the fleet's name, for the membership locks or the slots.
func fleetKey(name, what string) int32 {
	h := fnv.New32a()
	h.Write([]byte("bulkhead:" + name + ":" + what))
	return int32(h.Sum32())
}

// apply returns p with this process's share in force: B and Q are the
// share's, and each workload fits in it. g.mu is held.
func (f *fleet) apply(p Policy) Policy {
	p.MaxConcurrent, p.MaxQueue = f.cur.b, f.cur.q
	if len(p.Workloads) > 0 {
		ws := make(map[string]Workload, len(p.Workloads))
		for name, w := range p.Workloads {
			w.MaxConcurrent = min(w.MaxConcurrent, p.MaxConcurrent)
			w.MaxQueue = min(w.MaxQueue, p.MaxConcurrent+p.MaxQueue-w.MaxConcurrent)
			ws[name] = w
		}
		p.Workloads = ws
	}
	return p
}

// setShare puts s in force and reports it when it changed or err is set.
func (f *fleet) setShare(s share, err error) {
	f.g.mu.Lock()
	changed := s != f.cur
	if changed {
		f.cur = s
		f.g.setPolicyLocked(*f.g.policy.Load())
	}
	f.g.mu.Unlock()
	if on := f.g.opt.events.OnFleet; on != nil && (changed || err != nil) {
		emitFleet(on, FleetEvent{Fleet: f.name, Instances: int(f.instances.Load()), MaxConcurrent: s.b, MaxQueue: s.q, Err: err})
	}
}

func (f *fleet) share() share {
	f.g.mu.Lock()
	defer f.g.mu.Unlock()
	return f.cur
}

func (f *fleet) stats() FleetStats {
	s := FleetStats{
		Name:      f.name,
		Total:     f.g.policy.Load().MaxConcurrent,
		Instances: int(f.instances.Load()),
		Share:     f.share().b,
		Orphans:   int(f.orphans.Load()),
		ID:        f.id.Load(),
		Backend:   f.backend.Load(),
		Degraded:  f.degraded.Load(),
		Rounds:    f.rounds.Load(),
		Failures:  f.failures.Load(),
	}
	if e := f.lastErr.Load(); e != nil {
		s.LastError = *e
	}
	return s
}

// start runs the coordination loop: a round at once, then one per
// interval, until stop.
func (f *fleet) start() {
	f.started = true
	go func() {
		defer close(f.done)
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			select {
			case <-f.quit:
				return
			case <-t.C:
			}
			// A round has at least 5 s, a dial's time: a busy server may
			// answer a join or the round's statement slower than a short
			// interval, and a round cut off by its context is a failure.
			ctx, cancel := context.WithTimeout(context.Background(), max(f.interval, 5*time.Second))
			f.sync(ctx) // its error is in the stats and events
			cancel()
			// Short of its target, the instance waits for the others to
			// give back slots: it looks again after half an interval, so
			// that a give-back that landed just after its read does not
			// cost it a whole interval more.
			next := f.interval
			if f.short.Load() {
				next = f.interval / 2
			}
			t.Reset(next)
		}
	}()
}

// stop ends the loop, then leaves the fleet: the share goes to zero and
// the session that holds the slots is closed, which frees them, once no
// operation runs: at once if none does, else from a goroutine that waits
// for the last one to end.
func (f *fleet) stop() {
	f.once.Do(func() {
		close(f.quit)
		if f.started {
			<-f.done
		}
		f.roundMu.Lock()
		f.setShare(share{}, nil)
		if f.drainedNow() {
			f.dropSession()
			f.roundMu.Unlock()
			return
		}
		drained := f.g.lim.drained()
		go func() {
			defer f.roundMu.Unlock()
			<-drained
			f.dropSession()
		}()
	})
}

// drainedNow reports whether the operations running are within the share
// in force.
func (f *fleet) drainedNow() bool {
	if f.g.policy.Load().DryRun {
		return true
	}
	select {
	case <-f.g.lim.drained():
		return true
	default:
		return false
	}
}

// SyncFleet runs one coordination round of the gate's fleet now, beside
// those its loop runs once per interval, and returns its error (nil
// outside a fleet). A process may call it at start-up to wait for its
// first share, and tests to step the fleet.
func (g *Gate) SyncFleet(ctx context.Context) error {
	if g.fleet == nil {
		return nil
	}
	return g.fleet.sync(ctx)
}

// sync is one round: read the fleet, then give back or take slots.
func (f *fleet) sync(ctx context.Context) error {
	select {
	case <-f.quit:
		return ErrClosed
	default:
	}
	f.roundMu.Lock()
	defer f.roundMu.Unlock()
	select {
	case <-f.quit:
		return ErrClosed
	default:
	}
	f.rounds.Add(1)
	err := f.round(ctx)
	if err != nil {
		err = &fleetError{err: err}
		f.failures.Add(1)
		f.lastErr.Store(&err)
		f.degraded.Store(true)
		cur := f.share()
		f.setShare(share{b: min(cur.b, f.fallback), q: cur.q}, err)
		// The session may still be alive and hold slots: it is closed
		// only once the operations beyond the fallback ended (here, or at
		// a later round).
		if f.store != nil && f.drainedNow() {
			f.dropSession()
		} else if f.store != nil {
			f.stale = true
		}
		return err
	}
	f.lastErr.Store(nil)
	f.degraded.Store(false)
	return nil
}

func (f *fleet) round(ctx context.Context) error {
	if f.stale {
		if !f.waitDrained(ctx) {
			return errors.New("operations beyond the fallback share still run: the failed session, and its slots, are kept until they end")
		}
		f.dropSession()
	}
	if f.store == nil {
		st := f.newStore()
		// A process that joined before keeps its id, and reclaims it
		// if a session still holds it: its own previous one, which the
		// server has not ended yet (a network cut), and its connections
		// are tagged with it. One that never joined draws again: another
		// process drew the same id (the connections already tagged with
		// it count as the other's, at worst as orphans once it is gone).
		pid, err := st.join(ctx, f.id.Load(), f.joined)
		if err != nil {
			if errors.Is(err, errIDTaken) && !f.joined {
				f.id.Store(newFleetID())
			}
			return err
		}
		f.store, f.pid, f.held, f.joined = st, pid, nil, true
		f.backend.Store(pid)
	}
	var gs Stats
	f.g.lim.stats(&gs)
	load := f.load(gs)
	state := fmt.Sprintf("bulkhead fleet t=%d b=%d q=%d running=%d waiting=%d load=%s", f.g.policy.Load().MaxConcurrent, gs.MaxConcurrent, gs.MaxQueue, gs.Running, gs.Waiting, load)
	v, err := f.store.read(ctx, state)
	if err != nil {
		return err
	}
	members, slots := v.members, v.slots
	id := f.id.Load()
	rank := slices.IndexFunc(members, func(m fleetMember) bool { return m.id == id })
	if rank < 0 {
		return fmt.Errorf("this process's membership lock (id %d, session pid %d) is gone", id, f.pid)
	}
	members[rank].state = state // as the others will read it
	total := f.g.policy.Load()
	t, tq, n := total.MaxConcurrent, total.MaxQueue, len(members)
	f.instances.Store(int64(n))
	f.orphans.Store(int64(v.orphans))
	// The orphans run on slots their dead owner no longer holds: the
	// shares are of what is left.
	avail := max(0, t-v.orphans)
	target := fleetTargets(avail, members, f.lending)[rank]
	f.fair = fleetTargets(avail, members, false)[rank]
	q := tq / n
	if rank < tq%n {
		q++
	}
	f.held = f.held[:0]
	for s, pid := range slots {
		if pid == f.pid {
			f.held = append(f.held, s)
		}
	}
	slices.Sort(f.held)
	inRange := 0
	for _, s := range f.held {
		if s < t {
			inRange++
		}
	}
	f.short.Store(false)
	switch {
	case inRange > target || inRange < len(f.held):
		// Give back: first lower B, then wait for the operations beyond
		// it, then unlock (out-of-range slots first, then the highest).
		f.setShare(share{b: min(target, inRange), q: q}, nil)
		if !f.waitDrained(ctx) {
			return nil // the slots stay held; the next round gives them back
		}
		keep := min(target, inRange)
		var give []int
		kept := 0
		for _, s := range f.held {
			if s < t && kept < keep {
				kept++
				continue
			}
			give = append(give, s)
		}
		if err := f.store.unlock(ctx, give); err != nil {
			return err
		}
	case inRange < target:
		got, err := f.store.grow(ctx, t, target-inRange)
		if err != nil {
			return err
		}
		f.setShare(share{b: inRange + len(got), q: q}, nil)
		f.short.Store(inRange+len(got) < target)
		return nil
	default:
		f.setShare(share{b: inRange, q: q}, nil)
	}
	return nil
}

// waitDrained waits until the operations running are within the share in
// force, or ctx ends; it reports which. In dry-run nothing is enforced and
// nothing is waited for.
func (f *fleet) waitDrained(ctx context.Context) bool {
	if f.drainedNow() {
		return true
	}
	select {
	case <-f.g.lim.drained():
		return true
	case <-ctx.Done():
		return false
	}
}

// dropSession closes the coordination session: the server frees its
// locks.
func (f *fleet) dropSession() {
	if f.store == nil {
		return
	}
	f.store.leave()
	f.store, f.pid, f.held, f.stale = nil, 0, nil, false
	f.backend.Store(0)
}

// fleetMember is a member of the fleet as a round reads it: its id, its
// coordination session's backend pid, and the state it published at its
// last round.
type fleetMember struct {
	id, pid int64
	state   string
}

// fleetView is the fleet as a round reads it.
type fleetView struct {
	members []fleetMember // in id order
	slots   map[int]int64 // the holder's backend pid, by slot
	orphans int           // busy tagged connections beyond the slots of their id's member (orphans)
}

// orphans counts, from the busy tagged connections by id, those beyond
// the slots of the id's member: all of an id without a member. A
// member's connections whose state cannot be seen (unknown, by id: another
// role's, without pg_read_all_stats) are not counted; a dead id's are.
func orphans(members []fleetMember, slots map[int]int64, busy, unknown map[int64]int) int {
	held := map[int64]int{} // by holder pid
	for _, pid := range slots {
		held[pid]++
	}
	n := 0
	for id, b := range busy {
		if i := slices.IndexFunc(members, func(m fleetMember) bool { return m.id == id }); i >= 0 {
			n += max(0, b-held[members[i].pid])
		} else {
			n += b
		}
	}
	for id, u := range unknown {
		if !slices.ContainsFunc(members, func(m fleetMember) bool { return m.id == id }) {
			n += u
		}
	}
	return n
}

// Loads an instance publishes at each round (WithFleetLending uses them):
// idle (no operation since its last round), busy (some had to wait or
// were rejected: it could use more), active (neither).
const (
	loadIdle   = "idle"
	loadActive = "active"
	loadBusy   = "busy"
)

// load classifies this process's work since the last round. An instance
// that runs on borrowed slots and still works stays busy, so that it does
// not give them back just because they sufficed.
func (f *fleet) load(s Stats) string {
	prev := f.seen
	f.seen = s
	worked := s.Running > 0 || s.Admitted > prev.Admitted
	switch {
	case s.Waiting > 0 || s.WaitCount > prev.WaitCount || s.RejectedFull > prev.RejectedFull || s.RejectedTimeout > prev.RejectedTimeout:
		return loadBusy
	case worked && s.MaxConcurrent > f.fair:
		return loadBusy
	case worked:
		return loadActive
	}
	return loadIdle
}

// memberLoad reads the load a member published; a member that published
// none yet (it has not finished a round) counts as active.
func memberLoad(state string) string {
	for _, f := range strings.Fields(state) {
		if v, ok := strings.CutPrefix(f, "load="); ok && (v == loadIdle || v == loadBusy) {
			return v
		}
	}
	return loadActive
}

// fleetTargets returns each member's target share of t slots, members in
// id order. Without lending: ⌊t/n⌋, plus one for the first t mod n.
// With lending, active and busy members keep that fair share; an idle
// member keeps one slot of it (so that its next operation runs at once)
// and lends the rest, which goes to the busy members one slot at a time
// in id order; with no busy member nothing is lent. Every member
// computes the same targets from the same reading; readings a round apart
// may differ, which the slots' locks make harmless: a member only takes
// free slots, and no more than T minus the slots held and the orphans.
func fleetTargets(t int, members []fleetMember, lending bool) []int {
	n := len(members)
	targets := make([]int, n)
	for i := range targets {
		targets[i] = t / n
		if i < t%n {
			targets[i]++
		}
	}
	if !lending {
		return targets
	}
	pool := 0
	var busy []int
	for i, m := range members {
		switch memberLoad(m.state) {
		case loadIdle:
			pool += targets[i] - min(targets[i], 1)
		case loadBusy:
			busy = append(busy, i)
		}
	}
	if len(busy) == 0 || pool == 0 {
		return targets
	}
	for i, m := range members {
		if memberLoad(m.state) == loadIdle {
			targets[i] = min(targets[i], 1)
		}
	}
	for i := 0; pool > 0; i++ {
		targets[busy[i%len(busy)]]++
		pool--
	}
	return targets
}

// fleetStore is one coordination session: where the fleet's membership and
// slot locks live. pgStore is PostgreSQL's; the package's tests have an
// in-memory one.
type fleetStore interface {
	// join opens the session and takes the membership lock of id; it
	// returns the session's backend pid, which holds the slots it will
	// lock, or an error matching errIDTaken if another session holds
	// that membership lock. With reclaim, it also ends that session (the
	// process's own previous one): the next join finds the lock free.
	join(ctx context.Context, id int64, reclaim bool) (int64, error)
	// read returns the fleet: the members with the state each published
	// at its last round, which session holds each slot, and the orphans;
	// state is this process's, published for the others and for whoever
	// looks.
	read(ctx context.Context, state string) (fleetView, error)
	// grow locks up to n free slots below t, without waiting for any,
	// and returns those it got: under the fleet's grow lock, it takes no
	// more than t minus the slots held and the orphans, as one reading
	// finds them. It takes none, without waiting, while another member
	// holds the grow lock.
	grow(ctx context.Context, t, n int) ([]int, error)
	unlock(ctx context.Context, slots []int) error
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
	keys     FleetKeys
	interval time.Duration

	db   *sql.DB
	sess *sql.Conn
}

func (p *pgStore) join(ctx context.Context, id int64, reclaim bool) (int64, error) {
	db := sql.OpenDB(noCloseConnector{p.conn})
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
	key := itoa32(p.keys.Members) + ", " + strconv.FormatInt(id, 10)
	err = sess.QueryRowContext(ctx, "SELECT pg_backend_pid(), pg_try_advisory_lock("+key+"), set_config('idle_in_transaction_session_timeout', '"+idle+"', false)").Scan(&pid, &ok, new(string))
	if err == nil && !ok {
		err = fmt.Errorf("%w: (%s)", errIDTaken, key)
		if reclaim {
			var ended int
			if rerr := sess.QueryRowContext(ctx, "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_locks"+
				" WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND pid <> pg_backend_pid()"+
				" AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"+
				" AND classid::int8 = "+uint32s(p.keys.Members)+" AND objid::int8 = "+strconv.FormatInt(id, 10)).Scan(&ended); rerr != nil {
				err = fmt.Errorf("%w; ending it: %w", err, rerr)
			} else {
				err = fmt.Errorf("%w: by this process's previous session, which the server had not ended; ended %d session(s), the next round joins", err, ended)
			}
		}
	}
	if err != nil {
		sess.Close()
		db.Close()
		return 0, err
	}
	p.db, p.sess = db, sess
	return pid, nil
}

func (p *pgStore) leave() {
	// Unlock explicitly when the session still answers, so that the
	// locks are free before this returns, whatever database/sql then does
	// with the connection; closing it frees them anyway.
	ctx, cancel := context.WithTimeout(context.Background(), p.interval)
	_, _ = p.sess.ExecContext(ctx, "SELECT pg_advisory_unlock_all()")
	cancel()
	p.sess.Close()
	p.db.Close()
}

// read looks at pg_locks once. The same statement sets the session's
// application_name to state, which `bulkhead budget` shows:
// pg_stat_activity then tells each member's share and use as of its last
// round.
func (p *pgStore) read(ctx context.Context, state string) (fleetView, error) {
	return p.scan(ctx, p.sess, state)
}

// queryer is a session or a transaction on it.
type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// scan reads the fleet's locks from pg_locks in one statement, and, if
// state is not empty, publishes it as the session's application_name.
func (p *pgStore) scan(ctx context.Context, q queryer, state string) (fleetView, error) {
	var sb strings.Builder
	from := " FROM pg_locks l"
	if state != "" {
		sb.WriteString("WITH me AS (SELECT set_config('application_name', '" + state + "', false)) ")
		from = " FROM me, pg_locks l"
	}
	// An orphan is told by its state: a connection of a dead client
	// that is idle will never run again (the server ends it at its next
	// read). A state that cannot be seen (another role's session, without
	// pg_read_all_stats) is NULL.
	sb.WriteString("SELECT l.classid::int8, l.objid::int8, l.pid, coalesce(a.application_name, ''), coalesce(a.state, '')" +
		from + " LEFT JOIN pg_stat_activity a ON a.pid = l.pid" +
		" WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted" +
		" AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())" +
		" AND l.classid::int8 IN (" + uint32s(p.keys.Members, p.keys.Slots, p.keys.Conns) + ")")
	rows, err := q.QueryContext(ctx, sb.String())
	if err != nil {
		return fleetView{}, err
	}
	defer rows.Close()
	v := fleetView{slots: map[int]int64{}}
	busy, unknown := map[int64]int{}, map[int64]int{} // tagged connections by id: not idle, state not seen
	for rows.Next() {
		var class, obj, pid int64
		var app, state string
		if err := rows.Scan(&class, &obj, &pid, &app, &state); err != nil {
			return fleetView{}, err
		}
		switch class {
		case int64(uint32(p.keys.Members)):
			v.members = append(v.members, fleetMember{id: obj, pid: pid, state: app})
		case int64(uint32(p.keys.Slots)):
			v.slots[int(obj)] = pid
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
		return fleetView{}, err
	}
	slices.SortFunc(v.members, func(a, b fleetMember) int { return cmp.Compare(a.id, b.id) })
	v.orphans = orphans(v.members, v.slots, busy, unknown)
	return v, nil
}

// grow takes slots in a transaction that first takes the fleet's grow
// lock: two instances growing at once would each see room for the same
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
func freeSlots(v fleetView, t, n int) []int {
	n = min(n, t-len(v.slots)-v.orphans)
	var free []int
	for s := 0; s < t && len(free) < n; s++ {
		if _, taken := v.slots[s]; !taken {
			free = append(free, s)
		}
	}
	return free
}

func (p *pgStore) unlock(ctx context.Context, slots []int) error {
	if len(slots) == 0 {
		return nil
	}
	_, err := p.sess.ExecContext(ctx, "SELECT pg_advisory_unlock("+itoa32(p.keys.Slots)+", s) FROM unnest(ARRAY["+join(slots)+"]) AS s")
	return err
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

// noCloseConnector hides the inner connector's Close from the
// coordination pool: closing that pool must not close the gate's
// connector.
type noCloseConnector struct{ c driver.Connector }

func (n noCloseConnector) Connect(ctx context.Context) (driver.Conn, error) { return n.c.Connect(ctx) }
func (n noCloseConnector) Driver() driver.Driver                            { return n.c.Driver() }

// tag marks a server connection of the gate as this process's, before its
// first operation (conn.tagFor): a shared advisory lock (Conns, id) that
// the connection holds as long as it lives, so that the others count its
// work as an orphan's if this process dies while it runs. A connection
// that cannot be tagged is closed: its work would be invisible.
func (f *fleet) tag(ctx context.Context, c driver.Conn) error {
	q := "SELECT pg_advisory_lock_shared(" + itoa32(f.keys.Conns) + ", " + strconv.FormatInt(f.id.Load(), 10) + ")"
	if err := execConn(ctx, c, q); err != nil {
		return fmt.Errorf("bulkhead: fleet %s: tagging a new server connection (WithFleetTagging): %w", f.name, err)
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
		_, err = st.Exec(nil) //nolint:staticcheck // the driver's only way
	}
	return err
}

// emitFleet calls OnFleet; as emit, a panic in it is logged and
// recovered: it would otherwise end the coordination loop.
func emitFleet(f func(FleetEvent), e FleetEvent) {
	defer func() {
		if v := recover(); v != nil {
			slog.Default().Error("bulkhead: fleet event callback panicked", "fleet", e.Fleet, "panic", v, "stack", string(debug.Stack()))
		}
	}()
	f(e)
}
