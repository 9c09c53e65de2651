package tests

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/fleet"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// Fleet budgets on PostgreSQL (package fleet, docs/fleet.md). Each
// member here is one instance of a fleet; the loop's interval is an hour,
// so that the test steps the rounds itself with Sync (the loop runs one
// round at start, which only moves a member towards its target earlier).

// fleetName is a fleet name unique to the test and the process.
func fleetName(t testing.TB) string {
	return fmt.Sprintf("t%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
}

// fleetPolicy is a fleet's policy: total is T, queue the fleet's Q.
func fleetPolicy(total, queue int) bulkhead.Policy {
	return bulkhead.Policy{MaxConcurrent: total, MaxQueue: queue, QueueWait: time.Minute}
}

// fleetGate makes one member of the fleet name on the test server, its
// coordination sessions the test's own (directCoordination) unless opts
// name another coordinator, as fleetMember does.
func fleetGate(t *testing.T, name string, p bulkhead.Policy, opts ...fleet.Option) *fleet.Member {
	t.Helper()
	return fleetMember(t, name, stdlib.GetConnector(*pgConfig(t)), p, append([]fleet.Option{directCoordination(t)}, opts...)...)
}

// fleetSync runs a round of each of ms in turn, failing the test if one
// fails.
func fleetSync(t *testing.T, ctx context.Context, ms ...*fleet.Member) {
	t.Helper()
	for _, m := range ms {
		if err := m.Sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// directCoordination opens a fleet's coordination sessions on the test's
// PostgreSQL server itself, with an application_name of their own: the
// tests count the operations' transactions by the test's name.
func directCoordination(t *testing.T) fleet.Option { return dialedCoordination(t, nil) }

// dialedCoordination is directCoordination through dial (pgx's DialFunc)
// unless dial is nil.
func dialedCoordination(t *testing.T, dial pgconn.DialFunc) fleet.Option {
	coord := pgConfig(t)
	coord.RuntimeParams["application_name"] = appName(t) + "_fleet"
	if dial != nil {
		coord.DialFunc = dial
	}
	return fleet.Coordinator(stdlib.GetConnector(*coord))
}

// fleetSlots reads the fleet's locks from pg_locks as the server holds
// them: the membership locks, the slots held by each coordination backend
// pid, and the connections' tags by backend pid.
type fleetView struct {
	members int
	slots   map[int64]int // by backend pid
	total   int
	tags    map[int64]int // by backend pid
}

func fleetSlots(t *testing.T, ctx context.Context, admin *sql.DB, name string) fleetView {
	t.Helper()
	// As fleet.Keys documents them: advisory locks of the two-key form
	// (objsubid 2), classid the key as an unsigned 32-bit number.
	keys := fleet.LockKeys(name)
	key := func(k int32) int64 { return int64(uint32(k)) }
	rows, err := admin.QueryContext(ctx, `SELECT classid::int8, pid FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND classid::int8 IN ($1, $2, $3)`, key(keys.Members), key(keys.Slots), key(keys.Conns))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	v := fleetView{slots: map[int64]int{}, tags: map[int64]int{}}
	for rows.Next() {
		var class, pid int64
		if err := rows.Scan(&class, &pid); err != nil {
			t.Fatal(err)
		}
		switch class {
		case key(keys.Members):
			v.members++
		case key(keys.Slots):
			v.slots[pid]++
			v.total++
		default:
			v.tags[pid]++
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return v
}

// checkFleet asserts the fleet's promise at this instant: the slots held
// on the server add up to at most total, and no member's B exceeds the
// slots its session holds, nor its Share.
func checkFleet(t *testing.T, ctx context.Context, admin *sql.DB, name string, total int, ms []*fleet.Member) fleetView {
	t.Helper()
	v := fleetSlots(t, ctx, admin, name)
	if v.total > total {
		t.Fatalf("the fleet's sessions hold %d slots, want at most T=%d", v.total, total)
	}
	for i, m := range ms {
		s, fs := m.Gate().Stats(), m.Stats()
		if held := v.slots[fs.Backend]; s.MaxConcurrent > held || s.MaxConcurrent > fs.Share {
			t.Fatalf("instance %d: B=%d with %d slots held by its session (pid %d), share %d", i, s.MaxConcurrent, held, fs.Backend, fs.Share)
		}
	}
	return v
}

// fleetStart gives a fleet test its context (pgTestCtx), an ungated pool
// on the server (adminDB) and a fleet name of its own (fleetName).
func fleetStart(t *testing.T) (context.Context, *sql.DB, string) {
	t.Helper()
	return pgTestCtx(t), adminDB(t), fleetName(t)
}

func adminDB(t *testing.T) *sql.DB {
	t.Helper()
	return plainDB(t, stdlib.GetConnector(*pgConfig(t)))
}

func shares(ms []*fleet.Member) (b, q []int) {
	for _, m := range ms {
		s := m.Gate().Stats()
		b = append(b, s.MaxConcurrent)
		q = append(q, s.MaxQueue)
	}
	return b, q
}

func TestFleetSharesSplitTheTotalAndSettleWithinTwoRounds(t *testing.T) {
	ctx, admin, name := fleetStart(t)
	const total, queue = 8, 6
	var gs []*fleet.Member
	round := func() {
		t.Helper()
		for _, g := range gs {
			fleetSync(t, ctx, g)
			checkFleet(t, ctx, admin, name, total, gs)
		}
	}
	// Expected shares by instance count, members in id order: ⌊T/n⌋ and
	// one more for the first T mod n. The ids are drawn at random:
	// compare sorted.
	want := map[int]string{1: "[8] [6]", 2: "[4 4] [3 3]", 3: "[3 3 2] [2 2 2]", 4: "[2 2 2 2] [2 2 1 1]"}
	for n := 1; n <= 4; n++ {
		g := fleetGate(t, name, fleetPolicy(total, queue))
		gs = append(gs, g)
		fleetSync(t, ctx, g)
		checkFleet(t, ctx, admin, name, total, gs)
		round()
		round()
		b, q := shares(gs)
		if got := fmt.Sprint(sortDesc(b), sortDesc(q)); got != want[n] {
			t.Fatalf("%d instances, after two rounds: shares B, Q = %s, want %s", n, got, want[n])
		}
		for i, g := range gs {
			if s := g.Stats(); s.Instances != n || s.Total != total || s.Degraded || s.Name != name || s.Share != g.Gate().Stats().MaxConcurrent {
				t.Fatalf("%d instances: instance %d's fleet stats %+v (B=%d)", n, i, s, g.Gate().Stats().MaxConcurrent)
			}
		}
	}
	// Graceful stops: the others take the share back in one round.
	for len(gs) > 1 {
		if err := gs[0].Gate().OpenDB().Close(); err != nil {
			t.Fatal(err)
		}
		gs = gs[1:]
		if v := fleetSlots(t, ctx, admin, name); v.members != len(gs) {
			t.Fatalf("after a Close, %d members in pg_locks, want %d", v.members, len(gs))
		}
		round()
		b, q := shares(gs)
		if got := fmt.Sprint(sortDesc(b), sortDesc(q)); got != want[len(gs)] {
			t.Fatalf("%d instances, one round after a stop: shares %s, want %s", len(gs), got, want[len(gs)])
		}
	}
}

func sortDesc(xs []int) []int {
	out := slices.Clone(xs)
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

func TestFleetGivesSlotsBackOnlyOnceItsOperationsEnded(t *testing.T) {
	ctx, admin, name := fleetStart(t)
	p := fleetPolicy(4, 0)
	p.QueueWait = 0
	g1 := fleetGate(t, name, p)
	fleetSync(t, ctx, g1)
	db1 := g1.Gate().OpenDB()
	var txs []*sql.Tx
	for range 4 {
		tx := pgBegin(t, ctx, db1)
		testkit.Exec(t, ctx, tx, "SELECT 1")
		txs = append(txs, tx)
	}
	g2 := fleetGate(t, name, p)
	gs := []*fleet.Member{g1, g2}
	fleetSync(t, ctx, g2)
	// g1's target is 2: its B goes down at once, its slots stay locked
	// while 4 transactions run.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	fleetSync(t, short, g1)
	cancel()
	v := checkFleet(t, ctx, admin, name, 4, gs)
	if s, fs := g1.Gate().Stats(), g1.Stats(); s.MaxConcurrent != 2 || s.Running != 4 || v.slots[fs.Backend] != 4 {
		t.Fatalf("with 4 transactions open and a target of 2: B=%d, running %d, %d slots held; want 2, 4, 4", s.MaxConcurrent, s.Running, v.slots[fs.Backend])
	}
	fleetSync(t, ctx, g2)
	if s := g2.Gate().Stats(); s.MaxConcurrent != 0 {
		t.Fatalf("the newcomer got B=%d while the other still runs on all 4 slots, want 0", s.MaxConcurrent)
	}
	// With no share, the newcomer rejects at once.
	if _, err := g2.Gate().OpenDB().ExecContext(ctx, "SELECT 1"); !errors.Is(err, bulkhead.ErrAdmissionFull) {
		t.Fatalf("an operation on an instance without share: %v, want ErrAdmissionFull", err)
	}
	for _, tx := range txs[:2] {
		txCommit(t, tx)
	}
	fleetSync(t, ctx, g1)
	checkFleet(t, ctx, admin, name, 4, gs)
	fleetSync(t, ctx, g2)
	v = checkFleet(t, ctx, admin, name, 4, gs)
	if b, _ := shares(gs); fmt.Sprint(b) != "[2 2]" || v.total != 4 {
		t.Fatalf("once 2 transactions ended: shares %v, %d slots held, want [2 2] and 4", b, v.total)
	}
	for _, tx := range txs[2:] {
		txCommit(t, tx)
	}
	testkit.Exec(t, ctx, g2.Gate().OpenDB(), "SELECT 1")
}

// terminate ends a backend as a network failure or an administrator
// would.
func terminate(t *testing.T, ctx context.Context, admin *sql.DB, pid int64) {
	t.Helper()
	var ok bool
	if err := admin.QueryRowContext(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v, %v", pid, ok, err)
	}
	awaitGone(t, ctx, admin, pid)
}

// fleetReclaim cuts m's coordination session and holds m's membership
// lock on a session of admin, as the cut session would until the server
// noticed: the round after the cut fails with ErrCoordination, and the
// join after it too, saying it ended the previous session, which is then
// gone from the server.
func fleetReclaim(t *testing.T, ctx context.Context, admin *sql.DB, m *fleet.Member, name string) {
	t.Helper()
	s := m.Stats()
	failedRound(t, ctx, admin, m)
	stalePID := testkit.Scalar[int64](t, ctx, takeConn(t, ctx, admin), "SELECT pg_backend_pid() FROM pg_advisory_lock($1, $2)", fleet.LockKeys(name).Members, int32(s.ID))
	err := m.Sync(ctx)
	if !errors.Is(err, fleet.ErrCoordination) || !strings.Contains(err.Error(), "previous session") || !strings.Contains(err.Error(), "ended 1 session") {
		t.Fatalf("the join with its id held: %v, want ErrCoordination, the previous session ended", err)
	}
	awaitGone(t, ctx, admin, stalePID)
}

// failedRound ends m's coordination session (terminate) and checks that
// m's next round fails with ErrCoordination.
func failedRound(t *testing.T, ctx context.Context, admin *sql.DB, m *fleet.Member) {
	t.Helper()
	terminate(t, ctx, admin, m.Stats().Backend)
	if err := m.Sync(ctx); !errors.Is(err, fleet.ErrCoordination) {
		t.Fatalf("a round on a terminated session: %v, want ErrCoordination", err)
	}
}

// awaitGone waits until the backend pid has left pg_stat_activity, and
// so its locks are free: the server ends it asynchronously.
func awaitGone(t *testing.T, ctx context.Context, admin *sql.DB, pid int64) {
	t.Helper()
	awaitState(t, fmt.Sprintf("backend %d left pg_stat_activity", pid), func() bool {
		return testkit.Scalar[int](t, ctx, admin, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid) == 0
	})
}

func TestFleetFailedRoundLowersTheShareToTheFallbackAndNeverRaisesIt(t *testing.T) {
	ctx, admin, name := fleetStart(t)
	var mu sync.Mutex
	var events []fleet.Event
	onChange := fleet.OnChange(func(e fleet.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	})
	g1 := fleetGate(t, name, fleetPolicy(8, 0), onChange)
	fleetSync(t, ctx, g1)
	if s := g1.Gate().Stats(); s.MaxConcurrent != 8 {
		t.Fatalf("alone: B=%d, want 8", s.MaxConcurrent)
	}
	failedRound(t, ctx, admin, g1)
	s, fs := g1.Gate().Stats(), g1.Stats()
	if s.MaxConcurrent != fleet.DefaultFallback || !fs.Degraded || fs.Failures == 0 || !errors.Is(fs.LastError, fleet.ErrCoordination) {
		t.Fatalf("after a failed round: B=%d, fleet %+v; want B=%d, degraded, the error", s.MaxConcurrent, fs, fleet.DefaultFallback)
	}
	mu.Lock()
	last := events[len(events)-1]
	mu.Unlock()
	if !errors.Is(last.Err, fleet.ErrCoordination) || last.MaxConcurrent != fleet.DefaultFallback || last.Fleet != name {
		t.Fatalf("last fleet event %+v, want the failure with B=%d", last, fleet.DefaultFallback)
	}
	// The next round opens a new session and takes the share back.
	fleetSync(t, ctx, g1)
	if s, fs := g1.Gate().Stats(), g1.Stats(); s.MaxConcurrent != 8 || fs.Degraded || fs.LastError != nil {
		t.Fatalf("after recovery: B=%d, fleet %+v, want 8, not degraded", s.MaxConcurrent, fs)
	}
	// An instance without share keeps none when its round fails.
	g2 := fleetGate(t, name, fleetPolicy(8, 0))
	fleetSync(t, ctx, g2)
	if s := g2.Gate().Stats(); s.MaxConcurrent != 0 {
		t.Fatalf("newcomer in a full fleet: B=%d, want 0", s.MaxConcurrent)
	}
	failedRound(t, ctx, admin, g2)
	if s := g2.Gate().Stats(); s.MaxConcurrent != 0 {
		t.Fatalf("a failed round raised a share from 0 to %d", s.MaxConcurrent)
	}
	// fleet.Fallback(0): nothing runs while coordination fails.
	g3 := fleetGate(t, fleetName(t)+"z", fleetPolicy(8, 0), fleet.Fallback(0))
	fleetSync(t, ctx, g3)
	failedRound(t, ctx, admin, g3)
	if s := g3.Gate().Stats(); s.MaxConcurrent != 0 {
		t.Fatalf("fallback 0: B=%d after a failed round, want 0", s.MaxConcurrent)
	}
}

// The child side of TestFleetKilledInstanceFreesItsShare: one fleet
// instance in its own process, stepped through stdin, answering on stdout:
// "sync" runs a round and answers "pid <backend> b <B>"; "run N <query>"
// starts N operations running query, which the test makes wait on a lock
// it holds, and answers "started"; "load N <query>" starts N goroutines
// that run query over and over until the process ends, "burst N A D
// <query>" for the duration D after a delay A (in nanoseconds), each
// answered "started"; "next" waits for the end of the loop's next round
// and answers "pid <backend>". TestMain runs it when EnvFleetChild is set;
// with EnvFleetChildUntagged set, the instance does not tag its
// connections (fleet.Tagging(false)); with EnvFleetChildNoConnCheck
// set, its connections set client_connection_check_interval to 0, so that
// the statements a killed child leaves waiting go on waiting even on a
// server that checks for dead clients (PgBouncer refuses the parameter).
const (
	EnvFleetChild            = "BULKHEAD_TEST_FLEET_CHILD"
	EnvFleetChildUntagged    = "BULKHEAD_TEST_FLEET_CHILD_UNTAGGED"
	EnvFleetChildNoConnCheck = "BULKHEAD_TEST_FLEET_CHILD_NO_CONN_CHECK"
	EnvFleetChildInterval    = "BULKHEAD_TEST_FLEET_CHILD_INTERVAL" // fleet.Interval, a duration; an hour by default
	EnvFleetChildFallback    = "BULKHEAD_TEST_FLEET_CHILD_FALLBACK" // fleet.Fallback
	EnvFleetChildTotal       = "BULKHEAD_TEST_FLEET_CHILD_TOTAL"    // the fleet's T; 8 by default
)

func fleetChild(name string) int {
	if err := fleetChildRun(name); err != nil {
		fmt.Println("error", err)
		return 1
	}
	return 0
}

// fleetChildJoin joins the fleet name as the environment says.
func fleetChildJoin(name string) (*fleet.Member, error) {
	cfg, err := pgx.ParseConfig(os.Getenv(EnvDatabaseURL))
	if err != nil {
		return nil, err
	}
	if os.Getenv(EnvFleetChildNoConnCheck) != "" {
		cfg.RuntimeParams["client_connection_check_interval"] = "0"
	}
	opts := []fleet.Option{fleet.Interval(time.Hour), fleet.Tagging(os.Getenv(EnvFleetChildUntagged) == "")}
	if app := cfg.RuntimeParams["application_name"]; app != "" {
		// The coordination session apart from the operations, which a
		// test counts by their application_name.
		coord := cfg.Copy()
		coord.RuntimeParams["application_name"] = app + "_fleet"
		opts = append(opts, fleet.Coordinator(stdlib.GetConnector(*coord)))
	}
	var errs []error
	if v := os.Getenv(EnvFleetChildInterval); v != "" {
		d, err := time.ParseDuration(v)
		opts, errs = append(opts, fleet.Interval(d)), append(errs, err)
	}
	if v := os.Getenv(EnvFleetChildFallback); v != "" {
		f, err := strconv.Atoi(v)
		opts, errs = append(opts, fleet.Fallback(f)), append(errs, err)
	}
	total := 8
	if v := os.Getenv(EnvFleetChildTotal); v != "" {
		var err error
		total, err = strconv.Atoi(v)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return fleet.Join(name, stdlib.GetConnector(*cfg), fleetPolicy(total, 0), opts...)
}

func fleetChildRun(name string) error {
	m, err := fleetChildJoin(name)
	if err != nil {
		return err
	}
	// The loop's first round starts at once: let it start, so that the
	// first "sync" waits for it to end and nothing runs on the session
	// after an answer (a kill then never cuts a statement short).
	for i := 0; m.Stats().Rounds == 0; i++ {
		if i == 10000 {
			return errors.New("the fleet loop's first round did not start")
		}
		time.Sleep(time.Millisecond)
	}
	g := m.Gate()
	db := g.OpenDB()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, rest, _ := strings.Cut(in.Text(), " ")
		var n int
		var query string
		var each func() // what each of the n goroutines started runs
		switch cmd {
		case "run", "load":
			if _, err := fmt.Sscanf(rest, "%d", &n); err != nil {
				return err
			}
			_, query, _ = strings.Cut(rest, " ")
			each = func() { db.Exec(query) } // the process is killed while they run
			if cmd == "load" {
				each = func() { // until the process ends
					for {
						if _, err := db.Exec(query); err != nil {
							time.Sleep(time.Millisecond) // pacing after a rejection
						}
					}
				}
			}
		case "burst":
			var after, d time.Duration
			if _, err := fmt.Sscanf(rest, "%d %d %d", &n, &after, &d); err != nil {
				return err
			}
			query = strings.SplitN(rest, " ", 4)[3]
			start := time.Now().Add(after)
			end := start.Add(d)
			each = func() {
				time.Sleep(time.Until(start)) // the scenario's timing
				for time.Now().Before(end) {
					if _, err := db.Exec(query); err != nil {
						time.Sleep(time.Millisecond) // pacing after a rejection
					}
				}
			}
		}
		switch {
		case each != nil:
			for range n {
				go each()
			}
			fmt.Println("started")
		case in.Text() == "next":
			// After the round in progress, if any, and the next one.
			for r := m.Stats().Rounds + 1; m.Stats().Rounds <= r; {
				time.Sleep(time.Millisecond) // polling the loop's counter
			}
			fmt.Printf("pid %d\n", m.Stats().Backend)
		default:
			if err := m.Sync(context.Background()); err != nil {
				return err
			}
			fmt.Printf("pid %d b %d\n", m.Stats().Backend, g.Stats().MaxConcurrent)
		}
	}
	return nil
}

func TestFleetKilledInstanceFreesItsShare(t *testing.T) {
	ctx := pgTestCtx(t)
	admin := adminDB(t)
	g, c, pid := twoProcesses(t, ctx)
	c.kill()
	awaitGone(t, ctx, admin, pid)
	fleetSync(t, ctx, g)
	if s, fs := g.Gate().Stats(), g.Stats(); s.MaxConcurrent != 8 || fs.Instances != 1 {
		t.Fatalf("one round after the other process was killed: B=%d, %d instances; want 8, 1", s.MaxConcurrent, fs.Instances)
	}
}

// The statements a killed process left running go on until they end: the
// others' shares leave room for them, through the tags of its server
// connections, and take the room back once they ended. Without the tags
// (the child's fleet.Tagging(false)), the survivor takes the whole T at
// once while they still run: T + 3 on the server, the hole the tags close.
func TestFleetSharesLeaveRoomForAKilledInstancesStatements(t *testing.T) {
	for _, tagged := range []bool{true, false} {
		t.Run(fmt.Sprintf("tagged=%v", tagged), func(t *testing.T) {
			ctx := pgTestCtx(t)
			admin := adminDB(t)
			env := []string{EnvFleetChildNoConnCheck + "=1"}
			if !tagged {
				env = append(env, EnvFleetChildUntagged+"=1")
			}
			g, c, pid := twoProcesses(t, ctx, env...)
			name := g.Stats().Name
			// The child's 3 statements wait for a lock the test holds,
			// as long as it holds it.
			lock := takeConn(t, ctx, admin)
			key := time.Now().UnixNano() % 1e9
			testkit.Exec(t, ctx, lock, "SELECT pg_advisory_lock(7, $1)", key)
			stmt := fmt.Sprintf("SELECT pg_advisory_xact_lock_shared(7, %d)", key)
			c.started("run %d %s", 3, stmt)
			waiting := func() int {
				return testkit.Scalar[int](t, ctx, admin, "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = $1", stmt)
			}
			awaitState(t, "the child's 3 statements wait on the server", func() bool { return waiting() == 3 })
			c.kill()
			awaitGone(t, ctx, admin, pid)
			if n := waiting(); n != 3 {
				t.Fatalf("after the kill: %d of the child's statements still run, want 3 (they end only when they get the lock)", n)
			}
			fleetSync(t, ctx, g)
			s, fs := g.Gate().Stats(), g.Stats()
			if !tagged {
				if s.MaxConcurrent != 8 || fs.Orphans != 0 {
					t.Fatalf("untagged: B=%d, %d orphans; want 8, 0 (the hole: nothing shows the statements)", s.MaxConcurrent, fs.Orphans)
				}
				t.Logf("untagged: one round after the kill, B=%d beside the dead process's 3 running statements: room for %d on the server with T=8", s.MaxConcurrent, s.MaxConcurrent+3)
			} else {
				if s.MaxConcurrent != 5 || fs.Orphans != 3 || fs.Instances != 1 {
					t.Fatalf("one round after the kill, its 3 statements running: B=%d, %d orphans, %d instances; want 5, 3, 1", s.MaxConcurrent, fs.Orphans, fs.Instances)
				}
				if v := fleetSlots(t, ctx, admin, name); v.total+3 > 8 {
					t.Fatalf("%d slots held beside 3 orphans, T=8", v.total)
				}
			}
			// The statements get the lock, end, and their sessions
			// with them (the server finds the client gone).
			testkit.Exec(t, ctx, lock, "SELECT pg_advisory_unlock(7, $1)", key)
			awaitState(t, "the dead process's statements ended", func() bool { return waiting() == 0 })
			fleetSync(t, ctx, g)
			if s, fs := g.Gate().Stats(), g.Stats(); s.MaxConcurrent != 8 || fs.Orphans != 0 {
				t.Fatalf("once they ended: B=%d, %d orphans; want 8, 0", s.MaxConcurrent, fs.Orphans)
			}
		})
	}
}

// A member whose coordination session is lost while the server still holds
// its membership lock (a network cut: the server has not noticed) keeps
// its id: its next join ends that session, and the one after joins.
func TestFleetRejoinEndsTheSessionStillHoldingItsID(t *testing.T) {
	ctx, admin, name := fleetStart(t)
	g := fleetGate(t, name, fleetPolicy(4, 0))
	fleetSync(t, ctx, g)
	s := g.Stats()
	fleetReclaim(t, ctx, admin, g, name)
	fleetSync(t, ctx, g)
	if now, b := g.Stats(), g.Gate().Stats().MaxConcurrent; now.ID != s.ID || b != 4 || now.Degraded {
		t.Fatalf("after the rejoin: id %d (was %d), B=%d, degraded %v; want the same id, 4, false", now.ID, s.ID, b, now.Degraded)
	}
}

// A member that needs slots while another holds the fleet's grow lock does
// not wait for it: its round ends without them, and a later round takes
// them.
func TestFleetGrowDoesNotWaitForAnotherMembersGrow(t *testing.T) {
	ctx, admin, name := fleetStart(t)
	// Held before the member starts: its loop's first round too finds
	// it taken.
	other := testkit.Begin(t, ctx, admin)
	defer other.Rollback()
	testkit.Exec(t, ctx, other, "SELECT pg_advisory_xact_lock($1, 0)", fleet.LockKeys(name).Grow)
	g := fleetGate(t, name, fleetPolicy(4, 0))
	fleetSync(t, ctx, g)
	if s, fs := g.Gate().Stats(), g.Stats(); s.MaxConcurrent != 0 || fs.Instances != 1 {
		t.Fatalf("a round while another holds the grow lock: B=%d, %d instances; want 0, 1", s.MaxConcurrent, fs.Instances)
	}
	txRollback(t, other)
	fleetSync(t, ctx, g)
	if s := g.Gate().Stats(); s.MaxConcurrent != 4 {
		t.Fatalf("a round once the grow lock is free: B=%d, want 4", s.MaxConcurrent)
	}
}

// twoProcesses makes a fleet of T = 8 over two processes, this one's gate
// g and a child process c (env added to its environment), settled at 4
// and 4; pid is the child's coordination backend.
func twoProcesses(t *testing.T, ctx context.Context, env ...string) (g *fleet.Member, c *fleetChildProc, pid int64) {
	t.Helper()
	name := fleetName(t)
	g = fleetGate(t, name, fleetPolicy(8, 0))
	fleetSync(t, ctx, g)
	c = startFleetChild(t, ctx, name, postgresURL(t), env...)
	c.sync()
	fleetSync(t, ctx, g)
	pid, b := c.sync()
	if s, fs := g.Gate().Stats(), g.Stats(); s.MaxConcurrent != 4 || b != 4 || fs.Instances != 2 {
		t.Fatalf("two processes: B=%d here and %d in the child, %d instances; want 4, 4, 2", s.MaxConcurrent, b, fs.Instances)
	}
	return g, c, pid
}

// fleetChild's process, seen from the test.
type fleetChildProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.Writer
	out    *bufio.Scanner
	killed bool
}

// startFleetChild starts an instance of the fleet name in a process of
// its own (fleetChild), on the server at url, with env added to its
// environment; it is killed at the end of the test if the test did not.
func startFleetChild(t *testing.T, ctx context.Context, name, url string, env ...string) *fleetChildProc {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), EnvFleetChild+"="+name, EnvDatabaseURL+"="+url), env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &fleetChildProc{t: t, cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		if !c.killed {
			c.kill()
		}
	})
	return c
}

// ask sends the child a line and returns its answer.
func (c *fleetChildProc) ask(line string) string {
	c.t.Helper()
	if _, err := fmt.Fprintln(c.stdin, line); err != nil {
		c.t.Fatal(err)
	}
	if !c.out.Scan() {
		c.t.Fatalf("child: no answer to %q (%v)", line, c.out.Err())
	}
	return c.out.Text()
}

// started asks the child to start goroutines ("run", "load" or "burst",
// fleetChild) and checks that it did; a burst's durations are given in
// nanoseconds.
func (c *fleetChildProc) started(format string, args ...any) {
	c.t.Helper()
	if a := c.ask(fmt.Sprintf(format, args...)); a != "started" {
		c.t.Fatalf("child: %q, want started", a)
	}
}

// sync makes the child run a round and returns its coordination
// backend's pid and its B.
func (c *fleetChildProc) sync() (pid int64, b int) {
	c.t.Helper()
	a := c.ask("sync")
	if _, err := fmt.Sscanf(a, "pid %d b %d", &pid, &b); err != nil {
		c.t.Fatalf("child: %q (%v)", a, err)
	}
	return pid, b
}

// next waits for the end of the child's next round and returns its
// coordination backend's pid.
func (c *fleetChildProc) next() (pid int64) {
	c.t.Helper()
	a := c.ask("next")
	if _, err := fmt.Sscanf(a, "pid %d", &pid); err != nil {
		c.t.Fatalf("child: %q (%v)", a, err)
	}
	return pid
}

// kill sends SIGKILL: no goodbye.
func (c *fleetChildProc) kill() {
	c.killed = true
	if err := c.cmd.Process.Kill(); err != nil {
		c.t.Error(err)
	}
	c.cmd.Wait()
}

// Under load, while instances join and leave, the fleet's transactions on
// the server never exceed T, the tags of its server connections included:
// a connection is tagged before its first use, within the permits of the
// operation that uses it (a dial may outlive the operation it was started
// for, and its connection, untagged, serves the next).
func TestFleetServerTransactionsStayWithinTheTotalWhileInstancesComeAndGo(t *testing.T) {
	ctx, admin, name := fleetStart(t)
	const total = 4
	p := fleetPolicy(total, 4)
	p.QueueWait = 20 * time.Millisecond
	var ran, rejected, goal atomic.Int64
	goal.Store(1 << 62)
	enough := make(chan struct{})
	var once sync.Once
	var halts []func()
	// load runs 6 workers, 2000 transactions each at most, on g's pool
	// until the function it returns (and adds to halts) is called.
	load := func(g *bulkhead.Gate) (halt func()) {
		db := g.OpenDB()
		halt = sync.OnceFunc(testkit.Repeat(6, func(i int) bool {
			err := relWithTx(ctx, db, func(tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, "SELECT pg_sleep(0.002)")
				return err
			})
			switch {
			case err == nil:
				if ran.Add(1) >= goal.Load() {
					once.Do(func() { close(enough) })
				}
			case errors.Is(err, bulkhead.ErrRejected):
				rejected.Add(1)
				time.Sleep(time.Millisecond) // pacing, not synchronisation: keep the CPU for the server
			default:
				t.Error(err)
				return false
			}
			return i+6 < 6*2000
		}))
		halts = append(halts, halt)
		return halt
	}
	// The poller counts the fleet's open transactions that began before
	// its own statement, at each look (the tags taken meanwhile counted
	// apart too, to say so when the bound breaks).
	tag := "SELECT pg_advisory_lock_shared(" // fleet's sqlLockShared: the test's own connections, by application_name
	stopPoll := serverPeak(t, ctx, admin, `SELECT count(*), (count(*) FILTER (WHERE tagging))::text
		FROM (SELECT state = 'active' AND starts_with(query, $2) AS tagging FROM pg_stat_activity
		       WHERE application_name = $1 AND xact_start < statement_timestamp() AND pid <> pg_backend_pid()) a`,
		appName(t), tag)
	var gs []*fleet.Member
	step := func() {
		t.Helper()
		for _, g := range gs {
			if err := g.Sync(ctx); err != nil {
				t.Error(err)
			}
		}
	}
	for range 3 {
		g := fleetGate(t, name, p)
		gs = append(gs, g)
		load(g.Gate())
		step()
		step()
	}
	// A rolling deploy: a fourth joins, then the first leaves.
	g := fleetGate(t, name, p)
	gs = append(gs, g)
	load(g.Gate())
	step()
	step()
	halts[0]()
	gs[0].Gate().OpenDB().Close()
	gs = gs[1:]
	step()
	step()
	// Let 50 more transactions run after the changes.
	before := ran.Load()
	goal.Store(before + 50)
	select {
	case <-enough:
	case <-ctx.Done():
	}
	for _, halt := range halts {
		halt()
	}
	peak, looks, peakTags := stopPoll()
	t.Logf("%d transactions ran, %d rejected; %d looks at pg_stat_activity, peak %d (%s of them tags being taken)", ran.Load(), rejected.Load(), looks, peak, peakTags)
	if peak > total {
		t.Fatalf("the fleet had %d transactions open on the server at once, want at most T=%d", peak, total)
	}
	if ran.Load() <= before || looks == 0 {
		t.Fatalf("no work ran after the deploy (%d before, %d after) or no look (%d)", before, ran.Load(), looks)
	}
}

// BenchmarkFleetRound is the cost of one coordination round of an
// instance whose share does not change, with 1 or 8 instances in the
// fleet, each with 4 server connections (tagged): the pg_locks read and
// the application_name set, one statement. grow is the cost of a round
// that gives 4 slots back (T lowered from 8 to 4: one statement) plus one
// that takes them again (T back to 8: the grow's transaction), per pair.
func BenchmarkFleetRound(b *testing.B) {
	ctx := context.Background()
	instances := func(b *testing.B, n int) []*fleet.Member {
		cfg := pgConfig(b)
		name := fleetName(b)
		var gs []*fleet.Member
		for range n {
			g, err := fleet.Join(name, stdlib.GetConnector(*cfg), fleetPolicy(8, 8), fleet.Interval(time.Hour))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { g.Gate().OpenDB().Close() })
			gs = append(gs, g)
		}
		for range 2 {
			for _, g := range gs {
				if err := g.Sync(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		// 4 transactions open at once on each instance (within its
		// share when n = 1; fewer run at once otherwise): its pool keeps
		// their connections, tagged as they were dialed.
		for _, g := range gs {
			db := g.Gate().OpenDB()
			db.SetMaxIdleConns(4)
			var txs []*sql.Tx
			for range min(4, g.Gate().Stats().MaxConcurrent) {
				txs = append(txs, testkit.Begin(b, ctx, db))
			}
			for _, tx := range txs {
				tx.Commit()
			}
		}
		return gs
	}
	for _, n := range []int{1, 8} {
		b.Run(fmt.Sprintf("instances=%d", n), func(b *testing.B) {
			gs := instances(b, n)
			b.ResetTimer()
			for b.Loop() {
				if err := gs[0].Sync(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("grow", func(b *testing.B) {
		g := instances(b, 1)[0]
		p := g.Gate().Policy()
		for b.Loop() {
			for _, t := range []int{4, 8} {
				p.MaxConcurrent = t
				if err := g.Gate().SetPolicy(p); err != nil {
					b.Fatal(err)
				}
				if err := g.Sync(ctx); err != nil {
					b.Fatal(err)
				}
			}
			if s := g.Gate().Stats(); s.MaxConcurrent != 8 {
				b.Fatalf("B=%d after the pair of rounds, want 8", s.MaxConcurrent)
			}
		}
	})
}

// fleet.Lending: an idle instance lends all but one slot of its share
// to a busy one, and gets it back two rounds after it works again.
func TestFleetLendingMovesAnIdleShareToABusyInstanceAndBack(t *testing.T) {
	ctx, admin, name := fleetStart(t)
	p := fleetPolicy(4, 0)
	p.QueueWait = 0
	busy := fleetGate(t, name, p, fleet.Lending(true))
	idle := fleetGate(t, name, p, fleet.Lending(true))
	gs := []*fleet.Member{busy, idle}
	sync := func(g *fleet.Member) {
		t.Helper()
		fleetSync(t, ctx, g)
		checkFleet(t, ctx, admin, name, 4, gs)
	}
	for range 2 {
		sync(busy)
		sync(idle)
	}
	if b, _ := shares(gs); fmt.Sprint(b) != "[2 2]" {
		t.Fatalf("two instances, nothing run yet: shares %v, want [2 2]", b)
	}
	// The busy instance runs on both its slots and rejects a third
	// operation, before each of its rounds.
	db := busy.Gate().OpenDB()
	var txs []*sql.Tx
	overload := func() {
		t.Helper()
		for len(txs) < busy.Gate().Stats().MaxConcurrent {
			txs = append(txs, pgBegin(t, ctx, db))
		}
		if _, err := db.ExecContext(ctx, "SELECT 1"); !errors.Is(err, bulkhead.ErrAdmissionFull) {
			t.Fatalf("an operation beyond B=%d: %v, want ErrAdmissionFull", busy.Gate().Stats().MaxConcurrent, err)
		}
	}
	overload()
	sync(busy) // publishes busy
	sync(idle) // idle: keeps 1, lends 1
	overload()
	sync(busy) // takes the lent slot
	if b, _ := shares(gs); fmt.Sprint(b) != "[3 1]" {
		t.Fatalf("busy and idle: shares %v, want [3 1]", b)
	}
	overload() // runs 3 now
	// The idle instance works again: it publishes it, the borrower gives
	// the slot back once its operations beyond its fair share ended, and
	// the lender takes it at its next round.
	testkit.Exec(t, ctx, idle.Gate().OpenDB(), "SELECT 1")
	sync(idle) // publishes active
	for _, tx := range txs {
		txCommit(t, tx)
	}
	txs = []*sql.Tx{pgBegin(t, ctx, db), pgBegin(t, ctx, db)} // it still works, on its fair share
	sync(busy)                                                // its target is its fair share again: gives one back
	testkit.Exec(t, ctx, idle.Gate().OpenDB(), "SELECT 1")
	sync(idle)
	if b, _ := shares(gs); fmt.Sprint(b) != "[2 2]" {
		t.Fatalf("both working: shares %v, want [2 2]", b)
	}
	for _, tx := range txs {
		txCommit(t, tx)
	}
}
