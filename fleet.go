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
// ended. Each process also holds a membership lock keyed by its
// coordination session's backend pid, which is how the others count it.
// All these locks belong to one dedicated session per process: when the
// process dies, however it dies, the server ends that session and the
// locks are free at once. (Statements the dead process had running go on
// until they end: README "Fleets" says what that costs.)
//
// Once per interval (WithFleetInterval), and never on an operation's
// path, a process reads the fleet from pg_locks in one statement, works
// out its target (fleetTargets: ⌊T/n⌋ slots plus one for the first T mod
// n members in pid order, or with WithFleetLending what the idle lend to
// the busy), and then either gives back its excess, or tries (without
// waiting) to lock free slots up to its target. A process joining a full
// fleet therefore starts with no share; the others give back their excess
// at their next round, and it takes it at its next, which comes after half
// an interval while it is short of its target: within two intervals. The
// queue, which holds no server connection, is split the same way without
// locks.
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
	member   int32 // advisory lock key1 of the membership locks
	slot     int32 // advisory lock key1 of the slots
	interval time.Duration
	fallback int
	conn     driver.Connector

	// cur is the share in force; set under g.mu (apply reads it there).
	cur share

	roundMu  sync.Mutex        // one round at a time
	newStore func() fleetStore // opens a coordination session: pgStore, or a test's
	store    fleetStore        // the session; nil between sessions
	pid      int64             // its id among the members
	held     []int             // slots it holds, as the last read said
	lending  bool              // WithFleetLending
	seen     Stats             // the counters at the last round (load)
	fair     int               // the fair share at the last round
	stale    bool              // a round failed with operations beyond the fallback running: drop the session once they end

	instances, rounds, failures, backend atomic.Int64
	degraded, short                      atomic.Bool // short: the last round left the share below its target
	lastErr                              atomic.Pointer[error]

	quit    chan struct{}
	done    chan struct{}
	started bool
	once    sync.Once
}

func newFleet(g *Gate, name string) *fleet {
	f := &fleet{
		g:        g,
		name:     name,
		member:   fleetKey(name, "members"),
		slot:     fleetKey(name, "slots"),
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
	f.newStore = func() fleetStore { return &pgStore{conn: f.conn, member: f.member, slot: f.slot, interval: f.interval} }
	if g.opt.fleetStore != nil {
		f.newStore = g.opt.fleetStore
	}
	return f
}

// FleetLockKeys returns the first keys of a fleet's PostgreSQL advisory
// locks: each member holds (members, its coordination backend's pid), and
// each slot is (slots, its index from 0 to T−1). In pg_locks they are the
// rows with locktype 'advisory', objsubid 2 and classid the key as an
// unsigned 32-bit number; `bulkhead budget --fleet` reads them. The keys
// are 32 bits of a hash of the name: two fleets of one database whose
// names collide would share a budget, which a different name avoids.
func FleetLockKeys(name string) (members, slots int32) {
	return fleetKey(name, "members"), fleetKey(name, "slots")
}

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
		pid, err := st.join(ctx)
		if err != nil {
			return err
		}
		f.store, f.pid, f.held = st, pid, nil
		f.backend.Store(pid)
	}
	var gs Stats
	f.g.lim.stats(&gs)
	load := f.load(gs)
	state := fmt.Sprintf("bulkhead fleet t=%d b=%d q=%d running=%d waiting=%d load=%s", f.g.policy.Load().MaxConcurrent, gs.MaxConcurrent, gs.MaxQueue, gs.Running, gs.Waiting, load)
	members, slots, err := f.store.read(ctx, state)
	if err != nil {
		return err
	}
	rank := slices.IndexFunc(members, func(m fleetMember) bool { return m.pid == f.pid })
	if rank < 0 {
		return fmt.Errorf("this process's membership lock (pid %d) is gone", f.pid)
	}
	members[rank].state = state // as the others will read it
	total := f.g.policy.Load()
	t, tq, n := total.MaxConcurrent, total.MaxQueue, len(members)
	f.instances.Store(int64(n))
	target := fleetTargets(t, members, f.lending)[rank]
	f.fair = fleetTargets(t, members, false)[rank]
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
		var free []int
		for s := 0; s < t && len(free) < target-inRange; s++ {
			if _, taken := slots[s]; !taken {
				free = append(free, s)
			}
		}
		got, err := f.store.tryLock(ctx, free)
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

// fleetMember is a member of the fleet as a round reads it: its id and
// the state it published at its last round.
type fleetMember struct {
	pid   int64
	state string
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
// pid order. Without lending: ⌊t/n⌋, plus one for the first t mod n.
// With lending, active and busy members keep that fair share; an idle
// member keeps one slot of it (so that its next operation runs at once)
// and lends the rest, which goes to the busy members one slot at a time
// in pid order; with no busy member nothing is lent. Every member
// computes the same targets from the same reading; readings a round apart
// may differ, which the slots' locks make harmless: a member only takes
// free slots.
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
	// join opens the session and takes its membership lock; it returns
	// the member's id (the backend pid).
	join(ctx context.Context) (int64, error)
	// read returns the members, in pid order, each with the state it
	// published at its last round, and which member holds each slot;
	// state is this process's, published for the others and for whoever
	// looks.
	read(ctx context.Context, state string) (members []fleetMember, slots map[int]int64, err error)
	// tryLock tries, without waiting, to lock each of slots, and returns
	// those it got.
	tryLock(ctx context.Context, slots []int) ([]int, error)
	unlock(ctx context.Context, slots []int) error
	// leave ends the session, freeing its locks.
	leave()
}

// pgStore keeps a fleet's locks as session-level advisory locks of one
// dedicated PostgreSQL session, keys (member, backend pid) and (slot,
// index), read back from pg_locks.
type pgStore struct {
	conn         driver.Connector
	member, slot int32
	interval     time.Duration

	db   *sql.DB
	sess *sql.Conn
}

func (p *pgStore) join(ctx context.Context) (int64, error) {
	db := sql.OpenDB(noCloseConnector{p.conn})
	db.SetMaxIdleConns(1)
	sess, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return 0, err
	}
	var pid int64
	var ok bool
	err = sess.QueryRowContext(ctx, "SELECT pg_backend_pid(), pg_try_advisory_lock("+itoa32(p.member)+", pg_backend_pid())").Scan(&pid, &ok)
	if err == nil && !ok {
		err = fmt.Errorf("membership lock (%d, %d) held by another session", p.member, pid)
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
func (p *pgStore) read(ctx context.Context, state string) (members []fleetMember, slots map[int]int64, err error) {
	q := "WITH me AS (SELECT set_config('application_name', '" + state + "', false))" +
		" SELECT l.classid::int8, l.objid::int8, l.pid, coalesce(a.application_name, '')" +
		" FROM me, pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid" +
		" WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted" +
		" AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())" +
		" AND l.classid::int8 IN (" + strconv.FormatInt(int64(uint32(p.member)), 10) + ", " + strconv.FormatInt(int64(uint32(p.slot)), 10) + ")"
	rows, err := p.sess.QueryContext(ctx, q)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	slots = map[int]int64{}
	for rows.Next() {
		var class, obj, pid int64
		var app string
		if err := rows.Scan(&class, &obj, &pid, &app); err != nil {
			return nil, nil, err
		}
		if class == int64(uint32(p.member)) {
			members = append(members, fleetMember{pid: obj, state: app})
		} else {
			slots[int(obj)] = pid
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, err
	}
	slices.SortFunc(members, func(a, b fleetMember) int { return cmp.Compare(a.pid, b.pid) })
	return members, slots, nil
}

func (p *pgStore) tryLock(ctx context.Context, slots []int) ([]int, error) {
	if len(slots) == 0 {
		return nil, nil
	}
	rows, err := p.sess.QueryContext(ctx, "SELECT s FROM unnest(ARRAY["+join(slots)+"]) AS s WHERE pg_try_advisory_lock("+itoa32(p.slot)+", s)")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var got []int
	for rows.Next() {
		var s int
		if err := rows.Scan(&s); err != nil {
			return got, err
		}
		got = append(got, s)
	}
	return got, rows.Err()
}

func (p *pgStore) unlock(ctx context.Context, slots []int) error {
	if len(slots) == 0 {
		return nil
	}
	_, err := p.sess.ExecContext(ctx, "SELECT pg_advisory_unlock("+itoa32(p.slot)+", s) FROM unnest(ARRAY["+join(slots)+"]) AS s")
	return err
}

func itoa32(v int32) string { return strconv.FormatInt(int64(v), 10) }

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
