//go:build unix

package tests

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead/fleet"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// fleetPeak polls pg_stat_activity, until the returned function is
// called, for the transactions open at one instant on the connections
// named app or app_child (the operations of this process and of a
// child); that function returns the most seen at once, the number of
// looks, and the transactions seen at the peak (pid:application:query).
func fleetPeak(t *testing.T, ctx context.Context, app string) func() (peak, looks int, seen string) {
	t.Helper()
	return serverPeak(t, ctx, adminDB(t), `SELECT count(*), coalesce(string_agg(pid || ':' || application_name || ':' || left(query, 40), ' | '), '') FROM pg_stat_activity
		WHERE application_name IN ($1, $1 || '_child') AND xact_start < statement_timestamp() AND pid <> pg_backend_pid()`, app)
}

// fleetLoad runs n workers on db, each a 5 ms statement after another,
// counting those that ran in ran, until the returned function, which
// waits for them, is called.
func fleetLoad(ctx context.Context, db *sql.DB, n int, ran *atomic.Int64) (halt func()) {
	return testkit.Repeat(n, func(int) bool {
		if _, err := db.ExecContext(ctx, "SELECT pg_sleep(0.005)"); err == nil {
			ran.Add(1)
		} else {
			time.Sleep(time.Millisecond) // pacing after a rejection
		}
		return true
	})
}

// childURL is the test server's URL with the application_name the
// poller of fleetPeak counts as the child's.
func childURL(t *testing.T) string {
	t.Helper()
	u, err := url.Parse(postgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", appName(t)+"_child")
	u.RawQuery = q.Encode()
	return u.String()
}

// A member frozen by SIGSTOP keeps its coordination session, its
// membership and its slots; its lease runs out, and the others end its
// session (Stats.Expired) and take its share while it is stopped. Resumed,
// it runs on nothing until it has rejoined and been given a share: under
// load on both sides, with fallback 0, the fleet's transactions on the
// server never exceed T.
func TestFleetFrozenMemberIsEndedAndRunsOnNoStaleShareWhenResumed(t *testing.T) {
	ctx := pgTestCtx(t)
	name := fleetName(t)
	const total = 8
	interval := 500 * time.Millisecond
	g := fleetGate(t, name, fleetPolicy(total, 0), fleet.Interval(interval), fleet.Fallback(0))
	c := startFleetChild(t, ctx, name, childURL(t),
		EnvFleetChildInterval+"="+interval.String(), EnvFleetChildFallback+"=0")
	c.sync()
	awaitState(t, "the two members at 4 and 4", func() bool {
		_, b := c.sync()
		return b == total/2 && g.Gate().Stats().MaxConcurrent == total/2
	})

	peak := fleetPeak(t, ctx, appName(t))
	var ran atomic.Int64
	defer fleetLoad(ctx, g.Gate().OpenDB(), total, &ran)()
	c.started("load %d SELECT pg_sleep(0.005)", total)

	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	awaitState(t, "the frozen member's share back with this one", func() bool {
		return g.Gate().Stats().MaxConcurrent == total && g.Stats().Instances == 1
	})
	back := time.Since(frozen)
	if s := g.Stats(); s.Expired != 1 {
		t.Fatalf("stats %+v, want the frozen member's session ended once (Expired 1)", s)
	}
	// Stopped for 10 s in all.
	select {
	case <-time.After(time.Until(frozen.Add(10 * time.Second))):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	awaitState(t, "the resumed member rejoined at 4 and 4", func() bool {
		return g.Gate().Stats().MaxConcurrent == total/2 && g.Stats().Instances == 2
	})
	before := ran.Load()
	awaitState(t, "work runs after the rejoin", func() bool { return ran.Load() > before+50 })
	most, looks, seen := peak()
	t.Logf("figures: share back %v after SIGSTOP (interval %v); %d looks at pg_stat_activity, peak %d transactions", back.Round(time.Millisecond), interval, looks, most)
	if most > total {
		t.Fatalf("the fleet had %d transactions open on the server at once, want at most T=%d: %s", most, total, seen)
	}
}

// A member whose coordination session is ended while it is idle, just
// after its round (so the other's next round comes first), and whose load
// then returns: it runs on its share until its own next round tells it,
// while the other finds its slots free and its anchor still held, and
// takes none of them until the member has dropped to its fallback. The
// fleet's transactions on the server never exceed T with fallback 0, nor
// T plus the fallback with the default.
func TestFleetMemberWhoseSessionIsEndedUnderItStaysWithinItsSlots(t *testing.T) {
	for _, tc := range []struct {
		fallback, tries int
	}{{0, 20}, {fleet.DefaultFallback, 10}} {
		t.Run(fmt.Sprintf("fallback=%d", tc.fallback), func(t *testing.T) {
			// 20 tries of about a second each, three on a busy machine:
			// more than pgTestCtx's 30 s.
			ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
			defer cancel()
			name := fleetName(t)
			const total = 6
			// The test's own statements apart from the operations the
			// poller counts.
			cfg := pgConfig(t)
			cfg.RuntimeParams["application_name"] = appName(t) + "_admin"
			admin := plainDB(t, stdlib.GetConnector(*cfg))
			interval := 300 * time.Millisecond
			g := fleetGate(t, name, fleetPolicy(total, 0), fleet.Interval(interval), fleet.Fallback(tc.fallback))
			c := startFleetChild(t, ctx, name, childURL(t),
				EnvFleetChildInterval+"="+interval.String(), EnvFleetChildFallback+"="+strconv.Itoa(tc.fallback), EnvFleetChildTotal+"="+strconv.Itoa(total))
			settled := func() bool { return g.Gate().Stats().MaxConcurrent == total/2 && g.Stats().Instances == 2 }
			awaitState(t, "the two members at 3 and 3", settled)

			peak := fleetPeak(t, ctx, appName(t))
			halt := fleetLoad(ctx, g.Gate().OpenDB(), total, new(atomic.Int64))
			var settle []time.Duration // from the session's end to the shares back at 3 and 3
			for range tc.tries {
				// Its session ends just after its round; its load returns
				// after most of an interval, once the other has most likely
				// run a round, and before its own next round.
				pid := c.next()
				for i := 0; pid == 0 && i < 20; i++ { // a round that failed (a busy machine) left no session
					pid = c.next()
				}
				if pid == 0 {
					t.Fatal("the child's coordination rounds failed 20 times in a row")
				}
				c.started("burst %d %d %d SELECT pg_sleep(0.005)", total, interval*4/5, 2*interval)
				// false: a round that failed on a busy machine ended the
				// session first, which is the end this test makes.
				var ok bool
				if err := admin.QueryRowContext(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil {
					t.Fatalf("pg_terminate_backend(%d): %v", pid, err)
				}
				awaitGone(t, ctx, admin, pid)
				ended := time.Now()
				awaitState(t, "the member ended under it back at 3 and 3", func() bool {
					return settled() && fleetSlots(t, ctx, admin, name).members == 2
				})
				settle = append(settle, time.Since(ended))
			}
			halt()
			most, looks, seen := peak()
			t.Logf("figures: %d tries, interval %v; shares back %v to %v after the session ended; %d looks at pg_stat_activity, peak %d transactions",
				tc.tries, interval, slices.Min(settle).Round(time.Millisecond), slices.Max(settle).Round(time.Millisecond), looks, most)
			if most > total+tc.fallback {
				t.Fatalf("the fleet had %d transactions open on the server at once, want at most T+fallback=%d: %s", most, total+tc.fallback, seen)
			}
		})
	}
}

// A member whose coordination connections are blackholed (its writes
// vanish, nothing comes back) runs on its fallback once its lease is over;
// the other finds its session silent, ends it and takes its slots. Healed,
// it rejoins. Under load on both, the fleet's transactions on the server
// never exceed T plus the fallback.
func TestFleetMemberWhoseCoordinationIsBlackholedFallsBackAndRejoins(t *testing.T) {
	for _, fallback := range []int{0, fleet.DefaultFallback} {
		t.Run(fmt.Sprintf("fallback=%d", fallback), func(t *testing.T) {
			ctx := pgTestCtx(t)
			name := fleetName(t)
			const total, tries = 6, 3
			interval := 300 * time.Millisecond
			d := newRelFaultDialer(t)
			opts := []fleet.Option{fleet.Interval(interval), fleet.Fallback(fallback)}
			a := fleetGate(t, name, fleetPolicy(total, 0), append(opts, dialedCoordination(t, d.dial))...)
			b := fleetGate(t, name, fleetPolicy(total, 0), opts...)
			settled := func() bool {
				return a.Gate().Stats().MaxConcurrent == total/2 && b.Gate().Stats().MaxConcurrent == total/2 &&
					a.Stats().Instances == 2 && b.Stats().Instances == 2
			}
			awaitState(t, "the two members at 3 and 3", settled)

			peak := fleetPeak(t, ctx, appName(t))
			haltA := fleetLoad(ctx, a.Gate().OpenDB(), total, new(atomic.Int64))
			haltB := fleetLoad(ctx, b.Gate().OpenDB(), total, new(atomic.Int64))
			var back []time.Duration // from the blackhole to the other member holding the rest
			for range tries {
				d.mode.Store(relBlackhole)
				cut := time.Now()
				awaitState(t, "the blackholed member on its fallback, the other on the rest", func() bool {
					return a.Gate().Stats().MaxConcurrent <= fallback && b.Stats().Instances == 1 && b.Gate().Stats().MaxConcurrent >= total-fallback
				})
				back = append(back, time.Since(cut))
				d.heal()
				awaitState(t, "the healed member rejoined at 3 and 3", settled)
			}
			haltA()
			haltB()
			most, looks, seen := peak()
			t.Logf("figures: %d tries, interval %v; the other member on the rest %v to %v after the blackhole; %d looks at pg_stat_activity, peak %d transactions",
				tries, interval, slices.Min(back).Round(time.Millisecond), slices.Max(back).Round(time.Millisecond), looks, most)
			if most > total+fallback {
				t.Fatalf("the fleet had %d transactions open on the server at once, want at most T+fallback=%d: %s", most, total+fallback, seen)
			}
		})
	}
}
