package tests

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead/fleet"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// The fleet's statements bind the lock keys as int4, which may be
// negative, and compare pg_locks' classid and objid (oid) with the keys
// as unsigned numbers: a fleet whose keys are all negative (above 2³¹ in
// pg_locks) and one whose keys are all positive each run every statement
// (join and anchor, the read, a grow, an unlock, a tag, orphans seen, a
// reclaim, a leave, the end of an expired member), checked against
// pg_locks.
func TestFleetStatementsBindKeysOfEitherSign(t *testing.T) {
	for _, negative := range []bool{true, false} {
		t.Run(fmt.Sprintf("negative=%v", negative), func(t *testing.T) {
			ctx := pgTestCtx(t)
			admin := adminDB(t)
			name := signedFleetName(t, negative)
			keys := fleet.LockKeys(name)
			p := fleetPolicy(4, 0)
			want := func(what string, m *fleet.Member, b, orphans int) {
				t.Helper()
				if s, fs := m.Gate().Stats(), m.Stats(); s.MaxConcurrent != b || fs.Orphans != orphans || fs.Instances != 1 {
					t.Fatalf("%s: B=%d, %d orphans, %d instances; want %d, %d, 1", what, s.MaxConcurrent, fs.Orphans, fs.Instances, b, orphans)
				}
				if v := fleetSlots(t, ctx, admin, name); v.members != 1 || v.total != b || v.slots[m.Stats().Backend] != b {
					t.Fatalf("%s: pg_locks shows %d members, slots %v; want 1 member, %d slots held by pid %d", what, v.members, v.slots, b, m.Stats().Backend)
				}
			}

			// Join, anchor, read, grow.
			a := fleetGate(t, name, p)
			fleetSync(t, ctx, a)
			id := a.Stats().ID
			want("joined", a, 4, 0)
			if n := locksOf(t, ctx, admin, keys.Anchors, id); n != 1 {
				t.Fatalf("%d anchor locks (Anchors, %d), want 1", n, id)
			}
			var app string
			if err := admin.QueryRowContext(ctx, "SELECT application_name FROM pg_stat_activity WHERE pid = $1", a.Stats().Backend).Scan(&app); err != nil || !strings.HasPrefix(app, "bulkhead fleet t=4 ") {
				t.Fatalf("the coordination session's application_name %q (%v), want the state it published", app, err)
			}

			// A tag.
			testkit.Exec(t, ctx, a.Gate().OpenDB(), "SELECT 1")
			if n := locksOf(t, ctx, admin, keys.Conns, id); n < 1 {
				t.Fatalf("%d tags (Conns, %d) after an operation, want at least 1", n, id)
			}

			// Orphans, an unlock, a grow: a busy connection tagged with an
			// id no member holds.
			orphan := takeConn(t, ctx, admin)
			lock := takeConn(t, ctx, admin)
			const deadID = 98
			testkit.Exec(t, ctx, orphan, "SELECT pg_advisory_lock_shared($1, $2)", keys.Conns, int32(deadID))
			key := time.Now().UnixNano() % 1e9
			testkit.Exec(t, ctx, lock, "SELECT pg_advisory_lock(7, $1)", key)
			blocked := goExec(orphan, ctx, "SELECT pg_advisory_xact_lock_shared(7, $1)", key)
			awaitState(t, "the orphan's statement waits on the server", func() bool {
				return testkit.Scalar[int](t, ctx, admin, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = 7 AND objid = $1", key) == 1
			})
			fleetSync(t, ctx, a)
			want("an orphan running", a, 3, 1)
			testkit.Exec(t, ctx, lock, "SELECT pg_advisory_unlock(7, $1)", key)
			if err := <-blocked; err != nil {
				t.Fatal(err)
			}
			fleetSync(t, ctx, a)
			want("the orphan's statement ended", a, 4, 0)

			// A reclaim: a session of the test holds a's membership lock,
			// as its previous session would after a network cut.
			fleetReclaim(t, ctx, admin, a, name)
			fleetSync(t, ctx, a)
			want("rejoined", a, 4, 0)

			// A leave.
			if err := a.Gate().OpenDB().Close(); err != nil {
				t.Fatal(err)
			}
			if v := fleetSlots(t, ctx, admin, name); v.members != 0 || v.total != 0 || locksOf(t, ctx, admin, keys.Anchors, id) != 0 {
				t.Fatalf("after the leave: %d members, %d slots, anchor %d; want none", v.members, v.total, locksOf(t, ctx, admin, keys.Anchors, id))
			}

			// The end of an expired member: a session holding a membership
			// lock and an anchor, idle, and an idle connection tagged with
			// its id; another member, whose lease is short, ends both. (Its
			// interval is more than pg_terminate_backend's 100 ms between
			// looks: the end waits up to one interval to see a session gone.)
			const frozenID = 99
			frozen := holding(t, ctx, admin, "SELECT pg_advisory_lock($1, $2), pg_advisory_lock_shared($3, $2)", keys.Members, int32(frozenID), keys.Anchors)
			tagged := holding(t, ctx, admin, "SELECT pg_advisory_lock_shared($1, $2)", keys.Conns, int32(frozenID))
			c := fleetGate(t, name, p, fleet.Interval(300*time.Millisecond))
			awaitState(t, "the expired member's sessions ended", func() bool { return c.Stats().Expired > 0 })
			awaitGone(t, ctx, admin, frozen)
			awaitGone(t, ctx, admin, tagged)
			awaitState(t, "the other member runs on the whole T", func() bool { return c.Gate().Stats().MaxConcurrent == 4 })
		})
	}
}

// signedFleetName returns a fleet name unique to the test whose lock keys
// are all negative, or all positive.
func signedFleetName(t *testing.T, negative bool) string {
	t.Helper()
	base := fleetName(t)
	for i := range 10000 {
		name := fmt.Sprintf("%s-%d", base, i)
		k := fleet.LockKeys(name)
		ok := true
		for _, key := range []int32{k.Members, k.Slots, k.Conns, k.Grow, k.Anchors} {
			ok = ok && (key < 0) == negative
		}
		if ok {
			return name
		}
	}
	t.Fatalf("no fleet name with keys all negative=%v in 10000 tries", negative)
	return ""
}

// locksOf counts the granted advisory locks (key, id), as pg_locks shows
// them.
func locksOf(t *testing.T, ctx context.Context, admin *sql.DB, key int32, id int64) int {
	t.Helper()
	return testkit.Scalar[int](t, ctx, admin, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted
		AND classid::int8 = $1 AND objid::int8 = $2`, int64(uint32(key)), id)
}

// holding runs query with args on a session of its own, which then stays
// idle, and returns its backend pid.
func holding(t *testing.T, ctx context.Context, admin *sql.DB, query string, args ...any) int64 {
	t.Helper()
	c := takeConn(t, ctx, admin)
	pid := testkit.Scalar[int64](t, ctx, c, "SELECT pg_backend_pid()")
	testkit.Exec(t, ctx, c, query, args...)
	return pid
}
