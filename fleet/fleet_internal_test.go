//go:build go1.25

package fleet

// The fleet budget's rounds (round.go) against an in-memory lock table
// that behaves as PostgreSQL's advisory locks do: random joins, graceful
// stops, kills, failed rounds and operations starting and ending, with the
// fleet's promise checked after every step. The real server is in
// tests/fleet_test.go.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"math/rand"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// memLocks is the server: membership locks by id, slot locks by the
// holding session's backend pid, and the operations each process runs on
// the server, by id (what its connections' tags show).
type memLocks struct {
	mu      sync.Mutex
	next    int64 // the last backend pid given
	members map[int64]*memMember
	slots   map[int]int64
	anchors map[int64]int64 // the anchor session's pid, by member id
	busy    map[int64]int   // operations running on the server, by the id of the process that started them
	fail    map[int64]bool  // the session's next call fails (a query error; the session lives)
	dead    map[int64]bool  // the session is gone (its locks freed)

	// beforeGrow, if set, runs once at the start of the next grow, before
	// it reads the locks: what happens between a round's reading and its
	// taking slots.
	beforeGrow func()
}

type memMember struct {
	pid   int64
	state string
}

func newMemLocks() *memLocks {
	return &memLocks{members: map[int64]*memMember{}, slots: map[int]int64{}, anchors: map[int64]int64{}, busy: map[int64]int{}, fail: map[int64]bool{}, dead: map[int64]bool{}}
}

// drop frees the session's locks, as the server does when a session ends.
func (m *memLocks) drop(pid int64) {
	for id, mm := range m.members {
		if mm.pid == pid {
			delete(m.members, id)
		}
	}
	for s, p := range m.slots {
		if p == pid {
			delete(m.slots, s)
		}
	}
	for id, p := range m.anchors {
		if p == pid {
			delete(m.anchors, id)
		}
	}
}

func (m *memLocks) held(pid int64) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, p := range m.slots {
		if p == pid {
			n++
		}
	}
	return n
}

// view is what one reading of pg_locks shows. m.mu is held.
func (m *memLocks) view() view {
	v := view{slots: maps.Clone(m.slots)}
	for id, mm := range m.members {
		v.members = append(v.members, member{id: id, pid: mm.pid, state: mm.state})
	}
	slices.SortFunc(v.members, func(a, b member) int { return int(a.id - b.id) })
	v.orphans = orphans(v.members, v.slots, m.busy, nil)
	v.anchors = map[int64]bool{}
	for id := range m.anchors {
		v.anchors[id] = true
	}
	v.fenced = fenced(v)
	return v
}

type memStore struct {
	m               *memLocks
	pid, id, anchor int64
}

func (s *memStore) check() error {
	switch {
	case s.m.dead[s.pid]:
		return errors.New("session terminated")
	case s.m.fail[s.pid]:
		delete(s.m.fail, s.pid)
		return errors.New("injected failure")
	}
	return nil
}

func (s *memStore) join(_ context.Context, id int64, reclaim bool) (int64, error) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if mm := s.m.members[id]; mm != nil {
		if reclaim {
			s.m.dead[mm.pid] = true
			s.m.drop(mm.pid)
		}
		return 0, errIDTaken
	}
	s.m.next += 2 // the coordination session's pid, then its anchor's
	s.pid, s.id, s.anchor = s.m.next-1, id, s.m.next
	s.m.members[id] = &memMember{pid: s.pid}
	s.m.anchors[id] = s.anchor
	return s.pid, nil
}

func (s *memStore) read(_ context.Context, state string) (view, error) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if err := s.check(); err != nil {
		return view{}, err
	}
	s.m.members[s.id].state = state
	return s.m.view(), nil
}

func (s *memStore) grow(_ context.Context, t, n int) ([]int, error) {
	s.m.mu.Lock()
	if h := s.m.beforeGrow; h != nil {
		s.m.beforeGrow = nil
		s.m.mu.Unlock()
		h()
		s.m.mu.Lock()
	}
	defer s.m.mu.Unlock()
	if err := s.check(); err != nil {
		return nil, err
	}
	got := freeSlots(s.m.view(), t, n)
	for _, k := range got {
		s.m.slots[k] = s.pid
	}
	return got, nil
}

func (s *memStore) unlock(_ context.Context, give []int, state string) error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if err := s.check(); err != nil {
		return err
	}
	s.m.members[s.id].state = state
	for _, k := range give {
		if s.m.slots[k] == s.pid {
			delete(s.m.slots, k)
		}
	}
	return nil
}

func (s *memStore) end(_ context.Context, pid, _ int64) (bool, error) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if err := s.check(); err != nil {
		return false, err
	}
	s.m.killLocked(pid) // its anchor too
	return true, nil
}

func (s *memStore) leave() {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	s.m.drop(s.pid)
	s.m.drop(s.anchor)
}

// fleetInst is one process of the model.
type fleetInst struct {
	g       *fgate
	id      int64
	running int   // operations running on the server, started by the model
	closed  bool  // stopped gracefully (its running operations still count)
	killed  bool  // SIGKILL: gone; its running operations go on, orphans, until they end
	ended   int64 // the coordination session ended under it (pid), until it runs within its new session's slots and its fallback
}

func (in *fleetInst) pid() int64 { return in.g.m.backend.Load() }

func TestFleetModelKeepsRunningWorkWithinTheTotalAndSettlesWithinTwoRounds(t *testing.T) {
	seeds := 150
	if testing.Short() {
		seeds = 30
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { fleetModel(t, int64(seed)) })
	}
}

func fleetModel(t *testing.T, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	total, queue, fallback, lending := 1+rng.Intn(9), rng.Intn(5), rng.Intn(2), rng.Intn(2) == 1
	m := newMemLocks()
	p := bulkhead.Policy{MaxConcurrent: total, MaxQueue: queue, QueueWait: time.Millisecond}
	var all []*fleetInst
	defer func() {
		for _, in := range all {
			for ; in.running > 0; in.running-- {
				in.g.release()
			}
			in.g.db.Close()
		}
	}()
	// An operation starts and ends on the server: the tags of its
	// connection show it under the process's id.
	busy := func(in *fleetInst, d int) {
		in.running += d
		m.mu.Lock()
		m.busy[in.id] += d
		m.mu.Unlock()
	}
	live := func() []*fleetInst {
		var l []*fleetInst
		for _, in := range all {
			if !in.killed && (!in.closed || in.running > 0) {
				l = append(l, in)
			}
		}
		return l
	}
	round := func(in *fleetInst) {
		// A short context: a round that must wait for operations to end
		// before giving slots back gives up and keeps them.
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		err := in.g.m.Sync(ctx)
		if err != nil && !errors.Is(err, ErrCoordination) {
			t.Fatalf("seed %d: SyncFleet: %v", seed, err)
		}
	}
	// check asserts the promise: an instance runs no more operations
	// than its session holds slots, and its B is no more than those
	// slots; the operations on the server, the killed instances' orphans
	// included, are no more than T; the only excess allowed is a failed
	// instance's fallback share (WithFleetFallback), none with a
	// fallback of 0.
	check := func(step string) {
		t.Helper()
		sum, failed := 0, 0
		for _, in := range all {
			if in.killed {
				sum += in.running
			}
		}
		for _, in := range live() {
			s, held := in.g.Stats(), m.held(in.pid()) // no slot is held by pid 0
			sum += in.running
			if s.Fleet.Failures > 0 {
				failed++
			}
			if in.ended != 0 && (in.pid() == in.ended || in.running-held > fallback) {
				// Its slots are gone under it; it runs on its share until
				// its next round, which the others' fence leaves room for,
				// then on its fallback.
				continue
			}
			in.ended = 0
			if over := in.running - held; over > 0 && (fallback == 0 || over > fallback || s.Fleet.Failures == 0) {
				t.Fatalf("seed %d, %s: an instance runs %d operations on %d slots (fallback %d, %d failed rounds)", seed, step, in.running, held, fallback, s.Fleet.Failures)
			}
			if in.pid() != 0 && s.MaxConcurrent > held {
				t.Fatalf("seed %d, %s: an instance has B=%d on %d slots", seed, step, s.MaxConcurrent, held)
			}
			if in.pid() == 0 && s.MaxConcurrent > fallback {
				t.Fatalf("seed %d, %s: an instance without session has B=%d, fallback %d", seed, step, s.MaxConcurrent, fallback)
			}
		}
		if sum > total+failed*fallback {
			t.Fatalf("seed %d, %s: %d operations run on the server (orphans included), T=%d, %d instances failed a round, fallback %d", seed, step, sum, total, failed, fallback)
		}
	}
	join := func() {
		id := int64(len(all) + 1)
		// The loop's first round, with an hour to wait for operations to
		// end, starts before any operation runs; Sync then waits for it.
		g := memJoin(t, m, "model", nil, p, Fallback(fallback), Lending(lending), withID(id))
		in := &fleetInst{g: g, id: id}
		all = append(all, in)
		round(in)
	}
	join()
	var dying []int64 // killed halfway (killSlotsFirst): their membership locks are still held
	for step := 0; step < 200; step++ {
		l := live()
		var in *fleetInst
		if len(l) > 0 {
			in = l[rng.Intn(len(l))]
		}
		what := ""
		switch r := rng.Intn(100); {
		case r < 8 && len(l) < 8 || in == nil:
			what = "join"
			join()
		case r < 12:
			what = "stop"
			in.closed = true
			in.g.db.Close()
		case r < 15 && len(l) > 1:
			what = "kill"
			in.killed = true
			if pid := in.pid(); pid != 0 && rng.Intn(2) == 0 {
				// Caught halfway: the slots are free first, the
				// membership lock at a later step.
				what = "kill, slots first"
				m.killSlotsFirst(pid)
				dying = append(dying, pid)
			} else if pid != 0 {
				m.kill(pid)
			}
		case r < 18 && slices.ContainsFunc(all, func(in *fleetInst) bool { return in.killed && in.running > 0 }):
			what = "orphan ends"
			for _, in := range all {
				if in.killed && in.running > 0 {
					busy(in, -1)
					in.g.release()
					break
				}
			}
		case r < 20 && len(dying) > 0:
			what = "reap"
			m.reap(dying[0])
			dying = dying[1:]
		case r < 24:
			what = "fail"
			m.mu.Lock()
			m.fail[in.pid()] = true
			m.mu.Unlock()
		case r < 27 && in.pid() != 0 && in.ended == 0:
			what = "session ended"
			in.ended = in.pid()
			m.endSession(in.pid())
		case r < 50:
			what = "round"
			// Now and then another instance dies between this round's
			// reading and its taking of slots, if it takes any.
			var victim *fleetInst
			if others := slices.DeleteFunc(slices.Clone(l), func(o *fleetInst) bool { return o == in || o.pid() == 0 }); len(others) > 0 && rng.Intn(3) == 0 {
				victim = others[rng.Intn(len(others))]
				halfway := rng.Intn(2) == 0
				m.mu.Lock()
				m.beforeGrow = func() {
					what = "round, a death before its grow"
					victim.killed = true
					if halfway {
						m.killSlotsFirst(victim.pid())
						dying = append(dying, victim.pid())
					} else {
						m.kill(victim.pid())
					}
				}
				m.mu.Unlock()
			}
			if !in.closed {
				round(in)
			}
			m.mu.Lock()
			m.beforeGrow = nil
			m.mu.Unlock()
		case r < 75:
			what = "start"
			if in.g.tryNow() {
				busy(in, 1)
			}
		default:
			what = "end"
			if in.running > 0 {
				busy(in, -1)
				in.g.release()
			}
		}
		check(fmt.Sprintf("step %d (%s)", step, what))
	}
	// Everything ends, failures clear; two rounds of every instance
	// settle the shares.
	m.mu.Lock()
	clear(m.fail)
	m.mu.Unlock()
	for _, pid := range dying {
		m.reap(pid)
	}
	var up []*fleetInst
	for _, in := range all {
		for in.running > 0 {
			busy(in, -1)
			in.g.release() // a killed instance's gate is the model's no more: releasing lets it close
		}
		if !in.closed && !in.killed {
			up = append(up, in)
		}
	}
	// Stopped instances leave once their operations ended, from a
	// goroutine: let them.
	for _, in := range all {
		for i := 0; in.closed && in.pid() != 0; i++ {
			if i == 1e7 {
				t.Fatal("a stopped instance kept its session after its operations ended")
			}
			runtime.Gosched()
		}
	}
	// An instance whose session was ended learns it at its next round;
	// one without a session joins again at its next: the settling rounds
	// start with every instance in the fleet.
	for _, in := range up {
		if in.ended != 0 {
			round(in)
		}
		if in.pid() == 0 {
			round(in)
		}
	}
	for r := range 2 {
		for _, in := range up {
			round(in)
			check(fmt.Sprintf("settling round %d", r))
		}
	}
	if len(up) == 0 {
		return
	}
	n := len(up)
	var got []int
	sum := 0
	for _, in := range up {
		s := in.g.Stats()
		got = append(got, s.MaxConcurrent)
		sum += s.MaxConcurrent
		if s.Fleet.Instances != n || s.Fleet.Degraded {
			t.Fatalf("seed %d: settled instance: %+v, want %d instances, not degraded", seed, s.Fleet, n)
		}
	}
	slices.Sort(got)
	var want []int
	for r := range n {
		w := total / n
		if r < total%n {
			w++
		}
		want = append(want, w)
	}
	slices.Sort(want)
	if !slices.Equal(got, want) || sum != total {
		t.Fatalf("seed %d: T=%d over %d instances settled at %v, want %v", seed, total, n, got, want)
	}
}

// A policy's workloads fit in the process's share: their B at most the
// share's, their B+Q at most the share's B+Q; with no share, none runs.
func TestFleetShareClampsTheWorkloads(t *testing.T) {
	m := newMemLocks()
	p := bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 2, QueueWait: time.Millisecond,
		Workloads: map[string]bulkhead.Workload{"batch": {MaxConcurrent: 3, MaxQueue: 3, QueueWait: time.Millisecond}}}
	gs := []*fgate{memJoin(t, m, "wl", nil, p), memJoin(t, m, "wl", nil, p)}
	syncAll(t, gs...)
	syncAll(t, gs...)
	for i, g := range gs {
		s, _ := g.m.Gate().WorkloadStats("batch")
		if gs := g.Stats(); gs.MaxConcurrent != 2 || gs.MaxQueue != 1 || s.MaxConcurrent != 2 || s.MaxQueue != 1 {
			t.Fatalf("instance %d: share B=%d Q=%d, workload B=%d Q=%d; want 2, 1, 2, 1", i, gs.MaxConcurrent, gs.MaxQueue, s.MaxConcurrent, s.MaxQueue)
		}
	}
	if err := gs[1].m.Gate().SetPolicy(p); err != nil { // a reload keeps the share
		t.Fatal(err)
	}
	if s, _ := gs[1].m.Gate().WorkloadStats("batch"); s.MaxConcurrent != 2 || gs[1].Stats().MaxConcurrent != 2 {
		t.Fatalf("after SetPolicy: B=%d, workload B=%d, want the share kept: 2, 2", gs[1].Stats().MaxConcurrent, s.MaxConcurrent)
	}
	if p := gs[1].m.Gate().Policy(); p.MaxConcurrent != 4 || p.Workloads["batch"].MaxConcurrent != 3 {
		t.Fatalf("Policy() = %+v, want the policy as set", p)
	}
}

// kill ends the process whose coordination session is pid as a SIGKILL
// would: that session and its anchor (pid+1, memStore.join) end, their
// locks are freed, and its operations still running stay on the server
// (m.busy) as orphans.
func (m *memLocks) kill(pid int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.killLocked(pid)
}

// killLocked is kill with m.mu held.
func (m *memLocks) killLocked(pid int64) {
	m.dead[pid], m.dead[pid+1] = true, true
	m.drop(pid)
	m.drop(pid + 1)
}

// endSession ends the coordination session pid alone (pg_terminate_backend,
// a reset of that connection): the process runs on, its anchor held.
func (m *memLocks) endSession(pid int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dead[pid] = true
	m.drop(pid)
}

// killSlotsFirst is kill caught halfway, as a reading of pg_locks may
// catch the server releasing a dead session's locks one partition at a
// time: its slots are free, its membership lock still held, until reap.
func (m *memLocks) killSlotsFirst(pid int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dead[pid], m.dead[pid+1] = true, true
	m.drop(pid + 1)
	for k, p := range m.slots {
		if p == pid {
			delete(m.slots, k)
		}
	}
}

// reap ends what killSlotsFirst began.
func (m *memLocks) reap(pid int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.drop(pid)
}

// memJoin joins the fleet name on m with the policy p, an hour between
// rounds, and returns once its loop's first round has started; inner is
// the fake driver, a new one if nil. The member's *sql.DB is closed at
// the end of the test.
func memJoin(t *testing.T, m *memLocks, name string, inner *fakedb.Connector, p bulkhead.Policy, opts ...Option) *fgate {
	t.Helper()
	if inner == nil {
		inner = fakedb.New()
	}
	opts = append([]Option{Interval(time.Hour), withStore(func() store { return &memStore{m: m} })}, opts...)
	mb, err := Join(name, inner, p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	g := &fgate{m: mb, db: mb.Gate().OpenDB()}
	t.Cleanup(func() { g.db.Close() })
	firstRound(t, mb)
	return g
}

// modelGate is memJoin with the given id (0: drawn), its loop's first
// round done.
func modelGate(t *testing.T, m *memLocks, name string, p bulkhead.Policy, id int64, inner *fakedb.Connector, opts ...Option) *fgate {
	t.Helper()
	g := memJoin(t, m, name, inner, p, append([]Option{withID(id)}, opts...)...)
	syncAll(t, g) // waits for the first round to end
	return g
}

// run starts n operations on g, shown on the server under id.
func (m *memLocks) run(t *testing.T, g *fgate, id int64, n int) {
	t.Helper()
	for range n {
		if !g.tryNow() {
			t.Fatalf("instance %d: no permit for an operation (B=%d)", id, g.Stats().MaxConcurrent)
		}
	}
	m.mu.Lock()
	m.busy[id] += n
	m.mu.Unlock()
}

func syncAll(t *testing.T, gs ...*fgate) {
	t.Helper()
	for _, g := range gs {
		if err := g.m.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// roundShows runs a round of g and checks its B, the orphans it counted
// and the members it saw.
func roundShows(t *testing.T, what string, g *fgate, b, orphans, instances int) {
	t.Helper()
	syncAll(t, g)
	if s := g.Stats(); s.MaxConcurrent != b || s.Fleet.Orphans != orphans || s.Fleet.Instances != instances {
		t.Fatalf("%s: B=%d, %d orphans, %d instances; want %d, %d, %d", what, s.MaxConcurrent, s.Fleet.Orphans, s.Fleet.Instances, b, orphans, instances)
	}
}

// A killed instance's operations run on after its slots are freed: the
// survivor's share leaves room for them until they end, then takes all.
func TestFleetShareLeavesRoomForAKilledInstancesOrphans(t *testing.T) {
	m := newMemLocks()
	p := bulkhead.Policy{MaxConcurrent: 8, QueueWait: time.Millisecond}
	a, c := modelGate(t, m, "orphans", p, 1, nil), modelGate(t, m, "orphans", p, 2, nil)
	syncAll(t, a, c, a, c)
	if a.Stats().MaxConcurrent != 4 || c.Stats().MaxConcurrent != 4 {
		t.Fatalf("two instances, T=8: B=%d and %d, want 4 and 4", a.Stats().MaxConcurrent, c.Stats().MaxConcurrent)
	}
	m.run(t, c, 2, 3)
	m.kill(c.m.backend.Load())
	roundShows(t, "after the kill, 3 of its operations running", a, 5, 3, 1)
	// Its target is what is left: it is not short of it, so it does not
	// look again after half an interval while the orphans run.
	if a.m.short.Load() {
		t.Fatal("after the kill: the instance counts itself short of its target")
	}
	m.setBusy(2, 1) // two of them ended
	roundShows(t, "one orphan left", a, 7, 1, 1)
	m.setBusy(2, 0)
	roundShows(t, "no orphan left", a, 8, 0, 1)
	for range 3 {
		c.release()
	}
}

// An instance dies between another's reading of the fleet and its taking
// slots: the taker read it alive, holding all the slots, and finds them
// free when it takes; it must still leave room for the dead one's orphans.
// T = 4: c held the 4 slots and ran 3 operations; a joined, so c's target
// fell to 2, but c keeps its slots until the operations beyond its new B
// end. a, short of its target of 2, takes slots just after c died: room
// for T − held − orphans = 4 − 0 − 3 = 1.
func TestFleetSlotsTakenAfterADeathLeaveRoomForItsOrphans(t *testing.T) {
	m, c, a := drainingPair(t)
	m.mu.Lock()
	m.beforeGrow = func() { m.kill(c.m.backend.Load()) }
	m.mu.Unlock()
	syncAll(t, a)
	if s, h := a.Stats(), m.held(a.m.backend.Load()); s.MaxConcurrent != 1 || h != 1 || s.Fleet.Orphans != 0 {
		// The round read c alive: it counts no orphan, but took only the
		// room the orphans left.
		t.Fatalf("a, after c died between its reading and its taking: B=%d on %d slots, %d orphans counted; want 1, 1, 0", s.MaxConcurrent, h, s.Fleet.Orphans)
	}
	roundShows(t, "a's next round, which sees them", a, 1, 3, 1)
	m.setBusy(1, 0)
	roundShows(t, "once the orphans ended", a, 4, 0, 1)
}

// drainingPair makes a fleet of T = 4 on c (id 1) and a (id 2): c held the
// 4 slots and runs 3 operations; a joined, so c's target fell to 2, but c
// keeps its slots until the operations beyond its new B end; a has none.
func drainingPair(t *testing.T) (m *memLocks, c, a *fgate) {
	t.Helper()
	m = newMemLocks()
	p := bulkhead.Policy{MaxConcurrent: 4, QueueWait: time.Millisecond}
	c = modelGate(t, m, "draining", p, 1, nil)
	m.run(t, c, 1, 3)
	t.Cleanup(func() { // before memJoin's cleanup closes c
		for range 3 {
			c.release()
		}
	})
	a = modelGate(t, m, "draining", p, 2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	err := c.m.Sync(ctx) // B 4 → 2; its context ends before the 3 operations do: the slots stay
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	if s, h := c.Stats(), m.held(c.m.backend.Load()); s.MaxConcurrent != 2 || h != 4 {
		t.Fatalf("c: B=%d on %d slots, want 2 on 4 (3 operations running)", s.MaxConcurrent, h)
	}
	if s := a.Stats(); s.MaxConcurrent != 0 {
		t.Fatalf("a: B=%d, want 0", s.MaxConcurrent)
	}
	return m, c, a
}

// setBusy sets how many operations the process id runs on the server.
func (m *memLocks) setBusy(id int64, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.busy[id] = n
}

// The server frees a dead session's locks one lock partition at a time: a
// reading may find its slots free and its membership lock still held. Its
// operations then count beyond its slots (none), so that the others leave
// room for them as for orphans. T = 4: c held the 4 slots and ran 3
// operations (its target fell to 2 when a joined); c dies halfway.
func TestFleetSlotsFreedBeforeTheMembershipLeaveRoomForTheWork(t *testing.T) {
	m, c, a := drainingPair(t)
	m.killSlotsFirst(c.m.backend.Load())
	syncAll(t, a)
	// Two members, 3 operations beyond c's slots: 4 − 3 = 1 to share,
	// which goes to c (first in id order).
	if s, h := a.Stats(), m.held(a.m.backend.Load()); s.MaxConcurrent != 0 || h != 0 || s.Fleet.Orphans != 3 || s.Fleet.Instances != 2 {
		t.Fatalf("a, c's slots free and its membership held: B=%d on %d slots, %d orphans, %d instances; want 0, 0, 3, 2", s.MaxConcurrent, h, s.Fleet.Orphans, s.Fleet.Instances)
	}
	m.reap(c.m.backend.Load())
	roundShows(t, "a, c gone", a, 1, 3, 1)
	m.setBusy(1, 0)
	roundShows(t, "once c's operations ended", a, 4, 0, 1)
}

// Two processes drew the same id: the second's first join fails, it draws
// another, and joins at its next round. A process that joined before keeps
// its id and ends the session that still holds it (its own previous one,
// which the server has not ended: a network cut), then joins.
func TestFleetIDTakenIsDrawnAgainOrReclaimed(t *testing.T) {
	m := newMemLocks()
	p := bulkhead.Policy{MaxConcurrent: 4, QueueWait: time.Millisecond}
	a := modelGate(t, m, "ids", p, 7, nil)
	b := memJoin(t, m, "ids", nil, p, withID(7)) // its loop's first round fails
	ctx := context.Background()
	syncAll(t, b) // waits for the first round, then joins with a new id
	if s := b.Stats().Fleet; s.ID == 7 || s.Failures != 1 || s.LastError != nil || s.Instances != 2 {
		t.Fatalf("the second process with id 7: %+v; want a new id, one failure, then 2 instances", s)
	}
	syncAll(t, a, b)
	// a's session is lost while the server still holds its membership
	// lock: its next round fails, and it drops the session; the lock
	// stays with a session the server has not ended yet.
	m.mu.Lock()
	old := a.m.backend.Load()
	m.fail[old] = true
	m.mu.Unlock()
	if err := a.m.Sync(ctx); !errors.Is(err, ErrCoordination) {
		t.Fatalf("a's round with its session failing: %v, want ErrCoordination", err)
	}
	m.mu.Lock()
	m.members[7] = &memMember{pid: old} // the stale session still holds the lock
	m.mu.Unlock()
	if err := a.m.Sync(ctx); !errors.Is(err, errIDTaken) {
		t.Fatalf("a's next round: %v, want its id taken (and the stale session ended)", err)
	}
	syncAll(t, a) // a joins again
	if s := a.Stats().Fleet; s.ID != 7 || s.Instances != 2 || s.Degraded {
		t.Fatalf("a after reclaiming its id: %+v; want id 7, 2 instances", s)
	}
}

// Each server connection of a fleet's gate is tagged with the process's id
// before its first operation, through whichever way the driver runs a
// statement; Tagging(false) leaves the connections alone; a
// connection the tag fails or panics on is closed, the operation fails
// (naming the tag) or panics, and its permits are back.
func TestAFleetGateTagsEachServerConnectionBeforeItsFirstOperation(t *testing.T) {
	for _, c := range []struct {
		name    string
		conn    fakedb.ConnIface
		stmt    fakedb.StmtIface
		tagging bool
		want    fakedb.Op // 0: no tag
	}{
		{"ExecerContext", fakedb.ConnAll, fakedb.StmtAll, true, fakedb.OpExec},
		{"Prepare then StmtExecContext", 0, fakedb.StmtAll, true, fakedb.OpStmtExec},
		{"Prepare then Exec", 0, 0, true, fakedb.OpStmtExec},
		{"tagging off", fakedb.ConnAll, fakedb.StmtAll, false, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			fc := fakedb.New()
			fc.Conn, fc.Stmt = c.conn, c.stmt
			fc.Define("work", fakedb.ResultSet{})
			var mu sync.Mutex
			var tags []string
			g := tagGate(t, fc, func(op fakedb.Op, q string) error {
				if op != fakedb.OpPrepare {
					mu.Lock()
					tags = append(tags, fmt.Sprint(op, " ", q))
					mu.Unlock()
				}
				return nil
			}, Tagging(c.tagging))
			testkit.Exec(t, context.Background(), g.db, "work")
			var want []string
			q := sqlLockShared // its arguments: TestATagBindsTheFleetsKeyAndTheMembersID
			switch c.want {
			case fakedb.OpExec:
				want = []string{"Exec " + q}
			case fakedb.OpStmtExec: // and the statement is closed
				want = []string{"StmtExec " + q, "StmtClose " + q}
			}
			mu.Lock()
			defer mu.Unlock()
			if g.Stats().Fleet.ID <= 0 || fmt.Sprint(tags) != fmt.Sprint(want) {
				t.Fatalf("id %d; tags run %q, want %q", g.Stats().Fleet.ID, tags, want)
			}
		})
	}
	t.Run("tag panics", func(t *testing.T) {
		g := tagGate(t, fakedb.New(), func(fakedb.Op, string) error { panic("driver bug") })
		func() {
			defer func() {
				if recover() == nil {
					t.Error("the driver's panic did not propagate")
				}
			}()
			g.db.ExecContext(context.Background(), "work")
		}()
		if s := g.Stats(); s.Running != 0 || s.OpenConns != 0 {
			t.Fatalf("after the tag panicked: Running %d, OpenConns %d; want 0, 0", s.Running, s.OpenConns)
		}
	})
	t.Run("tag fails", func(t *testing.T) {
		fc := fakedb.New()
		boom := errors.New("boom")
		g := tagGate(t, fc, func(fakedb.Op, string) error { return boom })
		_, err := g.db.ExecContext(context.Background(), "work")
		if !errors.Is(err, boom) || !strings.Contains(err.Error(), "bulkhead: fleet tags: tagging a new server connection") {
			t.Fatalf("an operation whose connection could not be tagged: %v, want the tag's error, named", err)
		}
		if s := g.Stats(); s.Running != 0 {
			t.Fatalf("after the tag failed: Running %d, want 0", s.Running)
		}
		if open := fc.Count(fakedb.OpConnect) - fc.Count(fakedb.OpConnClose); open != 0 || fc.Count(fakedb.OpConnect) == 0 {
			t.Fatalf("%d connections left open after the failed tag, want 0", open)
		}
	})
}

// tagGate is a member, its loop's first round done, on fc, whose driver
// calls for a tag statement (its Prepare too) run tag instead.
func tagGate(t *testing.T, fc *fakedb.Connector, tag func(op fakedb.Op, q string) error, opts ...Option) *fgate {
	fc.SetHook(func(_ context.Context, op fakedb.Op, q string) error {
		if strings.Contains(q, "pg_advisory_lock_shared") {
			return tag(op, q)
		}
		return nil
	})
	return modelGate(t, newMemLocks(), "tags", bulkhead.Policy{MaxConcurrent: 4, QueueWait: time.Second}, 0, fc, opts...)
}

// fgate is a member and its gate's *sql.DB: Stats has the gate's and, in
// Fleet, the member's.
type fgate struct {
	m   *Member
	db  *sql.DB
	mu  sync.Mutex
	ops []*sql.Tx // operations started by tryNow, ended by release
}

type gstats struct {
	bulkhead.Stats
	Fleet Stats
}

func withStore(f func() store) Option { return func(m *Member) { m.newStore = f } }
func withID(id int64) Option          { return func(m *Member) { m.id.Store(id) } }

func (g *fgate) Stats() gstats { return gstats{g.m.Gate().Stats(), g.m.Stats()} }

// tryNow starts an operation if a permit is free (the model runs one
// step at a time: one free now is still free at BeginTx), a transaction
// held open until release. A refusal would count as a rejection, which
// would tell the fleet this member is busy: none is tried.
func (g *fgate) tryNow() bool {
	if s := g.m.Gate().Stats(); s.Running >= s.MaxConcurrent || s.Waiting > 0 {
		return false
	}
	tx, err := g.db.BeginTx(context.Background(), nil)
	if err != nil {
		panic(err)
	}
	g.mu.Lock()
	g.ops = append(g.ops, tx)
	g.mu.Unlock()
	return true
}

// release ends an operation tryNow started.
func (g *fgate) release() {
	g.mu.Lock()
	tx := g.ops[len(g.ops)-1]
	g.ops = g.ops[:len(g.ops)-1]
	g.mu.Unlock()
	if err := tx.Rollback(); err != nil {
		panic(err)
	}
}
