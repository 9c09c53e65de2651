package fleet

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dbbulkhead/bulkhead"
)

// The share arithmetic: pure functions of one reading of the fleet, which
// every member computes alike.

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

// loadOf classifies a member's work between two snapshots of its gate,
// prev at its last round and s now; fair is its fair share at its last
// round. A member that runs on borrowed slots (a B above fair) and still
// works stays busy, so that it does not give them back just because they
// sufficed.
func loadOf(prev, s bulkhead.Stats, fair int) string {
	worked := s.Running > 0 || s.Admitted > prev.Admitted
	switch {
	case s.Waiting > 0 || s.WaitCount > prev.WaitCount || s.RejectedFull > prev.RejectedFull || s.RejectedTimeout > prev.RejectedTimeout || s.RejectedDeadline > prev.RejectedDeadline:
		return loadBusy
	case worked && s.MaxConcurrent > fair:
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

// fairShare is the fair share of t, split among n members, of the member
// of rank i in id order: ⌊t/n⌋, plus one for the first t mod n.
func fairShare(t, n, i int) int {
	s := t / n
	if i < t%n {
		s++
	}
	return s
}

// targets returns each member's target share, members in id order, of
// the t slots less the orphans, which run on slots their dead owner no
// longer holds (none left when the orphans reach t). Without lending: the
// fair share of the slots left. With lending, active and busy members
// keep that fair share; an idle member keeps one slot of it and lends the
// rest, which goes to the busy members one slot at a time in id order;
// with no busy member nothing is lent.
// Every member computes the same targets from the same reading; readings
// a round apart may differ, which the slots' locks make harmless: a
// member only takes free slots, and no more than T minus the slots held
// and the orphans.
func targets(t, orphans int, members []member, lending bool) []int {
	t = max(0, t-orphans)
	n := len(members)
	out := make([]int, n)
	for i := range out {
		out[i] = fairShare(t, n, i)
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

// heldBy returns the slots the session pid holds, in order.
func heldBy(slots map[int]int64, pid int64) []int {
	var held []int
	for s, p := range slots {
		if p == pid {
			held = append(held, s)
		}
	}
	slices.Sort(held)
	return held
}

// giveBack returns, of the slots a member holds (in order), how many it
// keeps and which it gives back to come within target and t: it keeps
// the lowest below t, at most target of them, and gives back the rest,
// slots at or above t included (t was lowered).
func giveBack(held []int, t, target int) (keep int, give []int) {
	for _, s := range held {
		if s < t && keep < target {
			keep++
			continue
		}
		give = append(give, s)
	}
	return keep, give
}
