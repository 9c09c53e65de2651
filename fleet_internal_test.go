//go:build go1.25

package bulkhead

// The fleet budget's rounds (fleet.go) against an in-memory lock table
// that behaves as PostgreSQL's advisory locks do: random joins, graceful
// stops, kills, failed rounds and operations starting and ending, with the
// fleet's promise checked after every step. The real server is in
// tests/fleet_test.go.

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead/internal/fakedb"
)

// memLocks is the server: membership and slot locks, by member id.
type memLocks struct {
	mu      sync.Mutex
	next    int64
	members map[int64]string // the state each published
	slots   map[int]int64
	fail    map[int64]bool // the member's next call fails (a query error; the session lives)
	dead    map[int64]bool // the member's session is gone (its locks freed)
}

func newMemLocks() *memLocks {
	return &memLocks{members: map[int64]string{}, slots: map[int]int64{}, fail: map[int64]bool{}, dead: map[int64]bool{}}
}

// drop frees the member's locks, as the server does when a session ends.
func (m *memLocks) drop(pid int64) {
	delete(m.members, pid)
	for s, p := range m.slots {
		if p == pid {
			delete(m.slots, s)
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

type memStore struct {
	m   *memLocks
	pid int64
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

func (s *memStore) join(context.Context) (int64, error) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	s.m.next++
	s.pid = s.m.next
	s.m.members[s.pid] = ""
	return s.pid, nil
}

func (s *memStore) read(_ context.Context, state string) ([]fleetMember, map[int]int64, error) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if err := s.check(); err != nil {
		return nil, nil, err
	}
	s.m.members[s.pid] = state
	var members []fleetMember
	for p, st := range s.m.members {
		members = append(members, fleetMember{pid: p, state: st})
	}
	slices.SortFunc(members, func(a, b fleetMember) int { return int(a.pid - b.pid) })
	slots := map[int]int64{}
	for k, v := range s.m.slots {
		slots[k] = v
	}
	return members, slots, nil
}

func (s *memStore) tryLock(_ context.Context, want []int) ([]int, error) {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if err := s.check(); err != nil {
		return nil, err
	}
	var got []int
	for _, k := range want {
		if _, taken := s.m.slots[k]; !taken {
			s.m.slots[k] = s.pid
			got = append(got, k)
		}
	}
	return got, nil
}

func (s *memStore) unlock(_ context.Context, give []int) error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	if err := s.check(); err != nil {
		return err
	}
	for _, k := range give {
		if s.m.slots[k] == s.pid {
			delete(s.m.slots, k)
		}
	}
	return nil
}

func (s *memStore) leave() {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	s.m.drop(s.pid)
}

// fleetInst is one process of the model.
type fleetInst struct {
	g       *Gate
	running int  // operations holding permits, started by the model
	closed  bool // stopped gracefully (its running operations still count)
	killed  bool // SIGKILL: gone, with its operations
}

func (in *fleetInst) pid() int64 { return in.g.fleet.backend.Load() }

func withFleetStore(f func() fleetStore) Option { return func(o *options) { o.fleetStore = f } }

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
	p := Policy{MaxConcurrent: total, MaxQueue: queue, QueueWait: time.Millisecond, Fleet: "model"}
	var all []*fleetInst
	defer func() {
		for _, in := range all {
			for ; in.running > 0; in.running-- {
				in.g.lim.release()
			}
			in.g.Close()
		}
	}()
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
		err := in.g.SyncFleet(ctx)
		if err != nil && !errors.Is(err, ErrFleet) {
			t.Fatalf("seed %d: SyncFleet: %v", seed, err)
		}
	}
	// check asserts the promise: an instance runs no more operations
	// than its session holds slots, and its B is no more than those
	// slots; the only excess allowed is a failed instance's fallback
	// share (WithFleetFallback), none with a fallback of 0.
	check := func(step string) {
		t.Helper()
		sum, failed := 0, 0
		for _, in := range live() {
			s := in.g.Stats()
			held := 0
			if pid := in.pid(); pid != 0 {
				held = m.held(pid)
			}
			if over := in.running - held; over > 0 && (fallback == 0 || over > fallback || s.Fleet.Failures == 0) {
				t.Fatalf("seed %d, %s: an instance runs %d operations on %d slots (fallback %d, %d failed rounds)", seed, step, in.running, held, fallback, s.Fleet.Failures)
			}
			if in.pid() != 0 && s.MaxConcurrent > held {
				t.Fatalf("seed %d, %s: an instance has B=%d on %d slots", seed, step, s.MaxConcurrent, held)
			}
			if in.pid() == 0 && s.MaxConcurrent > fallback {
				t.Fatalf("seed %d, %s: an instance without session has B=%d, fallback %d", seed, step, s.MaxConcurrent, fallback)
			}
			sum += in.running
			if s.Fleet.Failures > 0 {
				failed++
			}
		}
		if sum > total+failed*fallback {
			t.Fatalf("seed %d, %s: %d operations run across the fleet, T=%d, %d instances failed a round, fallback %d", seed, step, sum, total, failed, fallback)
		}
	}
	join := func() {
		g, err := New(fakedb.New(), p, WithFleetInterval(time.Hour), WithFleetFallback(fallback), WithFleetLending(lending),
			withFleetStore(func() fleetStore { return &memStore{m: m} }))
		if err != nil {
			t.Fatal(err)
		}
		in := &fleetInst{g: g}
		all = append(all, in)
		// The loop's first round starts at once, with an hour to wait
		// for operations to end: let it start (SyncFleet then waits for
		// it to end) before any operation runs.
		for i := 0; g.fleet.rounds.Load() == 0; i++ {
			if i == 1e7 {
				t.Fatal("the fleet loop's first round did not start")
			}
			runtime.Gosched()
		}
		round(in)
	}
	join()
	for step := 0; step < 80; step++ {
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
			in.g.Close()
		case r < 15 && len(l) > 1:
			what = "kill"
			in.killed = true
			m.mu.Lock()
			if pid := in.pid(); pid != 0 {
				m.dead[pid] = true
				m.drop(pid)
			}
			m.mu.Unlock()
		case r < 20:
			what = "fail"
			m.mu.Lock()
			m.fail[in.pid()] = true
			m.mu.Unlock()
		case r < 50:
			what = "round"
			if !in.closed {
				round(in)
			}
		case r < 75:
			what = "start"
			if in.g.lim.tryNow() {
				in.running++
			}
		default:
			what = "end"
			if in.running > 0 {
				in.running--
				in.g.lim.release()
			}
		}
		check(fmt.Sprintf("step %d (%s)", step, what))
	}
	// Everything ends, failures clear; two rounds of every instance
	// settle the shares.
	m.mu.Lock()
	clear(m.fail)
	m.mu.Unlock()
	var up []*fleetInst
	for _, in := range all {
		for ; in.running > 0; in.running-- {
			in.g.lim.release()
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

func TestFleetTargetsSplitFairlyAndLendOnlyFromIdleToBusy(t *testing.T) {
	m := func(loads ...string) []fleetMember {
		var ms []fleetMember
		for i, l := range loads {
			st := ""
			if l != "" {
				st = "bulkhead fleet t=8 b=2 q=0 running=0 waiting=0 load=" + l
			}
			ms = append(ms, fleetMember{pid: int64(i + 1), state: st})
		}
		return ms
	}
	for _, c := range []struct {
		t       int
		members []fleetMember
		lending bool
		want    []int
	}{
		{8, m("", "", "", ""), false, []int{2, 2, 2, 2}},
		{8, m("", "", ""), false, []int{3, 3, 2}},
		{3, m("", "", "", ""), false, []int{1, 1, 1, 0}},
		{8, m("busy", "idle", "idle", "idle"), false, []int{2, 2, 2, 2}},
		{8, m("busy", "idle", "idle", "idle"), true, []int{5, 1, 1, 1}},
		{8, m("busy", "idle", "busy", "active"), true, []int{3, 1, 2, 2}},
		{8, m("idle", "idle", "idle", "idle"), true, []int{2, 2, 2, 2}}, // nobody to lend to
		{8, m("active", "idle", "", "idle"), true, []int{2, 2, 2, 2}},   // nor here: a member yet to report counts as active
		{3, m("busy", "idle", "idle", "idle"), true, []int{1, 1, 1, 0}}, // one slot each is kept: nothing to lend
		{9, m("idle", "busy", "busy"), true, []int{1, 4, 4}},
	} {
		if got := fleetTargets(c.t, c.members, c.lending); !slices.Equal(got, c.want) {
			t.Errorf("T=%d, loads %v, lending %v: targets %v, want %v", c.t, c.members, c.lending, got, c.want)
		}
	}
}

// A policy's workloads fit in the process's share: their B at most the
// share's, their B+Q at most the share's B+Q; with no share, none runs.
func TestFleetShareClampsTheWorkloads(t *testing.T) {
	m := newMemLocks()
	p := Policy{MaxConcurrent: 4, MaxQueue: 2, QueueWait: time.Millisecond, Fleet: "wl",
		Workloads: map[string]Workload{"batch": {MaxConcurrent: 3, MaxQueue: 3, QueueWait: time.Millisecond}}}
	var gs []*Gate
	for range 2 {
		g, err := New(fakedb.New(), p, WithFleetInterval(time.Hour), withFleetStore(func() fleetStore { return &memStore{m: m} }))
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		for i := 0; g.fleet.rounds.Load() == 0; i++ {
			if i == 1e7 {
				t.Fatal("the fleet loop's first round did not start")
			}
			runtime.Gosched()
		}
		gs = append(gs, g)
	}
	for range 2 {
		for _, g := range gs {
			if err := g.SyncFleet(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, g := range gs {
		s, _ := g.WorkloadStats("batch")
		if gs := g.Stats(); gs.MaxConcurrent != 2 || gs.MaxQueue != 1 || s.MaxConcurrent != 2 || s.MaxQueue != 1 {
			t.Fatalf("instance %d: share B=%d Q=%d, workload B=%d Q=%d; want 2, 1, 2, 1", i, gs.MaxConcurrent, gs.MaxQueue, s.MaxConcurrent, s.MaxQueue)
		}
	}
	if err := gs[1].SetPolicy(p); err != nil { // a reload keeps the share
		t.Fatal(err)
	}
	if s, _ := gs[1].WorkloadStats("batch"); s.MaxConcurrent != 2 || gs[1].Stats().MaxConcurrent != 2 {
		t.Fatalf("after SetPolicy: B=%d, workload B=%d, want the share kept: 2, 2", gs[1].Stats().MaxConcurrent, s.MaxConcurrent)
	}
	if p := gs[1].Policy(); p.MaxConcurrent != 4 || p.Workloads["batch"].MaxConcurrent != 3 {
		t.Fatalf("Policy() = %+v, want the policy as set", p)
	}
}
