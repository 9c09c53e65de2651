package fleet

import (
	"fmt"
	"slices"
	"testing"

	"github.com/dbbulkhead/bulkhead"
)

// loads makes members with ids 1, 2, ... in order, each having published
// the load given ("": nothing published yet).
func loads(ls ...string) []member {
	var ms []member
	for i, l := range ls {
		st := ""
		if l != "" {
			st = "bulkhead fleet t=8 b=2 q=0 running=0 waiting=0 load=" + l
		}
		ms = append(ms, member{id: int64(i + 1), state: st})
	}
	return ms
}

// loadsOf returns the loads the members published, as targets reads them.
func loadsOf(ms []member) []string {
	var ls []string
	for _, m := range ms {
		ls = append(ls, memberLoad(m.state))
	}
	return ls
}

func TestFleetTargetsSplitFairlyAndLendOnlyFromIdleToBusy(t *testing.T) {
	for _, c := range []struct {
		t, orphans int
		members    []member
		lending    bool
		want       []int
	}{
		{8, 0, loads("", "", "", ""), false, []int{2, 2, 2, 2}},
		{8, 0, loads("", "", ""), false, []int{3, 3, 2}},                         // the remainder to the first in id order
		{3, 0, loads("", "", "", ""), false, []int{1, 1, 1, 0}},                  // more members than T: the last has nothing
		{2, 0, loads("", "", "", ""), false, []int{1, 1, 0, 0}},                  // two with nothing
		{0, 0, loads("", ""), false, []int{0, 0}},                                // T = 0
		{8, 0, loads(""), false, []int{8}},                                       // one member takes all
		{8, 0, nil, false, []int{}},                                              // no member
		{8, 0, loads("busy", "idle", "idle", "idle"), false, []int{2, 2, 2, 2}},  // loads count only with lending
		{8, 0, loads("busy", "idle", "idle", "idle"), true, []int{5, 1, 1, 1}},   // the idle keep one slot each
		{8, 0, loads("busy", "idle", "busy", "active"), true, []int{3, 1, 2, 2}}, // one slot at a time to the busy in id order
		{8, 0, loads("idle", "idle", "idle", "idle"), true, []int{2, 2, 2, 2}},   // nobody to lend to
		{8, 0, loads("active", "idle", "", "idle"), true, []int{2, 2, 2, 2}},     // nor here: a member yet to report counts as active
		{8, 0, loads("other", "idle", "busy"), true, []int{3, 1, 4}},             // an unknown load counts as active
		{3, 0, loads("busy", "idle", "idle", "idle"), true, []int{1, 1, 1, 0}},   // one slot each is kept: nothing to lend
		{9, 0, loads("idle", "busy", "busy"), true, []int{1, 4, 4}},              // an even lending
		{8, 0, loads("busy", "busy", "idle"), true, []int{4, 3, 1}},              // an odd one: the first busy gets the extra slot
		{11, 0, loads("busy", "idle", "idle", "busy"), true, []int{5, 1, 1, 4}},  // the remainder, then the lending, in id order
		{8, 0, loads("idle"), true, []int{8}},                                    // an idle member alone keeps its share
		{8, 3, loads(""), false, []int{5}},                                       // the orphans' slots are left out
		{8, 3, loads("", ""), false, []int{3, 2}},                                // and the rest split as T would be
		{8, 8, loads("", ""), false, []int{0, 0}},                                // orphans take all of T
		{8, 11, loads("", ""), false, []int{0, 0}},                               // orphans exceeding T: nothing, never less
		{8, 11, loads("busy", "idle"), true, []int{0, 0}},                        // nor with lending
		{8, 2, loads("busy", "idle"), true, []int{5, 1}},                         // lending of what the orphans leave
		{3, 1, loads("busy", "idle", "idle"), true, []int{1, 1, 0}},              // 2 left over 3: nothing to lend
		{7, 0, loads("idle", "busy"), true, []int{1, 6}},                         // the remainder is lent too
		{2, 0, loads("busy", "idle", "idle"), true, []int{1, 1, 0}},              // an idle member with nothing lends nothing
	} {
		got := targets(c.t, c.orphans, c.members, c.lending)
		if !slices.Equal(got, c.want) {
			t.Errorf("T=%d, %d orphans, loads %v, lending %v: targets %v, want %v", c.t, c.orphans, loadsOf(c.members), c.lending, got, c.want)
		}
		sum := 0
		for _, s := range got {
			sum += s
		}
		if len(c.members) > 0 && sum != max(0, c.t-c.orphans) {
			t.Errorf("T=%d, %d orphans, loads %v, lending %v: targets %v add up to %d, want T minus the orphans", c.t, c.orphans, loadsOf(c.members), c.lending, got, sum)
		}
	}
}

// The queue is split as the slots are, without orphans or lending.
func TestFleetFairShareGivesTheRemainderToTheFirstInIDOrder(t *testing.T) {
	for _, c := range []struct{ t, n, i, want int }{
		{8, 4, 0, 2}, {8, 3, 0, 3}, {8, 3, 1, 3}, {8, 3, 2, 2},
		{6, 4, 0, 2}, {6, 4, 1, 2}, {6, 4, 2, 1}, {6, 4, 3, 1},
		{3, 4, 3, 0}, {0, 2, 0, 0}, {1, 1, 0, 1},
	} {
		if got := fairShare(c.t, c.n, c.i); got != c.want {
			t.Errorf("fairShare(%d, %d, %d) = %d, want %d", c.t, c.n, c.i, got, c.want)
		}
	}
}

func TestFleetOrphansAreBusyConnectionsBeyondTheirMembersSlots(t *testing.T) {
	members := []member{{id: 1, pid: 10}, {id: 2, pid: 20}}
	for _, c := range []struct {
		name          string
		slots         map[int]int64
		busy, unknown map[int64]int
		want          int
	}{
		{"none", map[int]int64{0: 10}, nil, nil, 0},
		{"within the member's slots", map[int]int64{0: 10, 1: 10, 2: 10}, map[int64]int{1: 2}, nil, 0},
		{"beyond the member's slots", map[int]int64{0: 10, 1: 10}, map[int64]int{1: 4}, nil, 2},
		{"an id with no member", map[int]int64{0: 10}, map[int64]int{3: 2}, nil, 2},
		{"a member holding no slot (its slots freed first)", map[int]int64{0: 10}, map[int64]int{2: 1}, nil, 1},
		{"another session's slots are not the member's", map[int]int64{0: 20, 1: 20}, map[int64]int{1: 2}, nil, 2},
		{"unseen, of an id with no member", nil, nil, map[int64]int{3: 2}, 2},
		{"unseen, of a member", nil, nil, map[int64]int{1: 5}, 0},
		{"all at once", map[int]int64{0: 10, 1: 10, 2: 20}, map[int64]int{1: 3, 3: 1}, map[int64]int{4: 2, 2: 1}, 4},
	} {
		if got := orphans(members, c.slots, c.busy, c.unknown); got != c.want {
			t.Errorf("%s: %d orphans, want %d", c.name, got, c.want)
		}
	}
}

func TestFleetFencedWhileAMemberMayRunBeyondItsSlots(t *testing.T) {
	st := func(b int) string {
		return fmt.Sprintf("bulkhead fleet t=8 b=%d q=0 running=0 waiting=0 load=active", b)
	}
	for _, c := range []struct {
		name    string
		members []member
		slots   map[int]int64
		anchors []int64
		want    bool
	}{
		{"each anchor with its membership", []member{{id: 1, pid: 10}, {id: 2, pid: 20}}, nil, []int64{1, 2}, false},
		{"an anchor without membership", []member{{id: 1, pid: 10}}, nil, []int64{1, 2}, true},
		{"a membership without anchor", []member{{id: 1, pid: 10}, {id: 2, pid: 20}}, nil, []int64{1}, false},
		{"a B within the slots held", []member{{id: 1, pid: 10, state: st(2)}}, map[int]int64{0: 10, 1: 10}, []int64{1}, false},
		{"a B above the slots held", []member{{id: 1, pid: 10, state: st(2)}}, map[int]int64{0: 10, 1: 20}, []int64{1}, true},
		{"a B of 0 on no slot", []member{{id: 1, pid: 10, state: st(0)}}, nil, []int64{1}, false},
		{"nothing published", []member{{id: 1, pid: 10}}, nil, []int64{1}, false},
	} {
		v := view{members: c.members, slots: c.slots, anchors: map[int64]bool{}}
		for _, id := range c.anchors {
			v.anchors[id] = true
		}
		if got := fenced(v); got != c.want {
			t.Errorf("%s: fenced %v, want %v", c.name, got, c.want)
		}
	}
}

func TestFleetPublishedStateIsReadBack(t *testing.T) {
	for _, c := range []struct {
		state string
		b     int
		load  string
	}{
		{"bulkhead fleet t=8 b=3 q=1 running=2 waiting=0 load=busy", 3, loadBusy},
		{"bulkhead fleet t=8 b=0 q=0 running=0 waiting=0 load=idle", 0, loadIdle},
		{"bulkhead fleet t=8 b=2 q=0 running=1 waiting=0 load=active", 2, loadActive},
		{"bulkhead fleet t=8 b=x load=other", 0, loadActive},
		{"", 0, loadActive},
		{"an application's own name", 0, loadActive},
	} {
		if b, l := publishedB(c.state), memberLoad(c.state); b != c.b || l != c.load {
			t.Errorf("%q: B=%d, load %s; want %d, %s", c.state, b, l, c.b, c.load)
		}
	}
}

func TestFleetFreeSlotsLeaveRoomForTheSlotsHeldAndTheOrphans(t *testing.T) {
	for _, c := range []struct {
		name    string
		slots   map[int]int64
		orphans int
		fenced  bool
		t, n    int
		want    []int
	}{
		{"the lowest free", nil, 0, false, 4, 2, []int{0, 1}},
		{"up to n", nil, 0, false, 4, 9, []int{0, 1, 2, 3}},
		{"around the held ones", map[int]int64{0: 10, 2: 20}, 0, false, 4, 4, []int{1, 3}},
		{"room left for the orphans", map[int]int64{0: 10}, 1, false, 4, 4, []int{1, 2}},
		{"a slot held above t counts", map[int]int64{5: 10}, 0, false, 4, 4, []int{0, 1, 2}},
		{"orphans exceeding t", nil, 6, false, 4, 2, nil},
		{"all held", map[int]int64{0: 10, 1: 10, 2: 20, 3: 20}, 0, false, 4, 1, nil},
		{"none wanted", nil, 0, false, 4, 0, nil},
		{"fenced", nil, 0, true, 4, 2, nil},
	} {
		v := view{slots: c.slots, orphans: c.orphans, fenced: c.fenced}
		if v.slots == nil {
			v.slots = map[int]int64{}
		}
		if got := freeSlots(v, c.t, c.n); !slices.Equal(got, c.want) {
			t.Errorf("%s: free slots %v, want %v", c.name, got, c.want)
		}
	}
}

func TestFleetGiveBackKeepsTheLowestSlotsWithinTheTargetAndT(t *testing.T) {
	for _, c := range []struct {
		held      []int
		t, target int
		keep      int
		give      []int
	}{
		{[]int{0, 1, 2, 3}, 4, 2, 2, []int{2, 3}}, // the highest go
		{[]int{0, 1, 2, 3}, 4, 4, 4, nil},         // at the target
		{[]int{0, 1}, 4, 3, 2, nil},               // short of it: nothing to give
		{[]int{0, 1, 5, 6}, 4, 4, 2, []int{5, 6}}, // t lowered: the slots at or above it go, even short of the target
		{[]int{0, 1, 5}, 4, 1, 1, []int{1, 5}},    // both
		{[]int{1, 3}, 2, 2, 1, []int{3}},          // a slot at t's edge
		{[]int{0, 1, 2}, 4, 0, 0, []int{0, 1, 2}}, // a target of 0: all go
		{nil, 4, 2, 0, nil},                       // none held
	} {
		keep, give := giveBack(c.held, c.t, c.target)
		if keep != c.keep || !slices.Equal(give, c.give) {
			t.Errorf("held %v, T=%d, target %d: keeps %d, gives %v; want %d, %v", c.held, c.t, c.target, keep, give, c.keep, c.give)
		}
	}
	if got := heldBy(map[int]int64{0: 10, 3: 10, 1: 20, 2: 10}, 10); !slices.Equal(got, []int{0, 2, 3}) {
		t.Errorf("heldBy: %v, want [0 2 3], in order", got)
	}
}

func TestFleetLoadIsBusyWhenWorkWaitedOrWasRefused(t *testing.T) {
	prev := bulkhead.Stats{MaxConcurrent: 2, Admitted: 5, WaitCount: 2, RejectedFull: 1, RejectedTimeout: 1, RejectedDeadline: 1}
	with := func(f func(*bulkhead.Stats)) bulkhead.Stats {
		s := prev
		f(&s)
		return s
	}
	for _, c := range []struct {
		name string
		s    bulkhead.Stats
		fair int
		want string
	}{
		{"nothing since the last round", prev, 2, loadIdle},
		{"running", with(func(s *bulkhead.Stats) { s.Running = 1 }), 2, loadActive},
		{"admitted and done", with(func(s *bulkhead.Stats) { s.Admitted++ }), 2, loadActive},
		{"waiting", with(func(s *bulkhead.Stats) { s.Waiting = 1 }), 2, loadBusy},
		{"waited", with(func(s *bulkhead.Stats) { s.WaitCount++ }), 2, loadBusy},
		{"rejected full", with(func(s *bulkhead.Stats) { s.RejectedFull++ }), 2, loadBusy},
		{"rejected after a wait", with(func(s *bulkhead.Stats) { s.RejectedTimeout++ }), 2, loadBusy},
		{"rejected for its deadline", with(func(s *bulkhead.Stats) { s.RejectedDeadline++ }), 2, loadBusy},
		{"working on borrowed slots", with(func(s *bulkhead.Stats) { s.MaxConcurrent, s.Running = 5, 1 }), 2, loadBusy},
		{"idle on borrowed slots", with(func(s *bulkhead.Stats) { s.MaxConcurrent = 5 }), 2, loadIdle},
	} {
		if got := loadOf(prev, c.s, c.fair); got != c.want {
			t.Errorf("%s: load %s, want %s", c.name, got, c.want)
		}
	}
}
