package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli/clitest"
	"github.com/dbbulkhead/bulkhead/fleet"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// serverLimit reads max_connections − superuser_reserved_connections −
// reserved_connections (where it exists) from the test server directly.
func serverLimit(t *testing.T) (maxConns, available int) {
	t.Helper()
	db := openServer(t)
	defer db.Close() // not kept while the test counts connections
	q := `SELECT current_setting('max_connections')::int,
		current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int
		- coalesce(current_setting('reserved_connections', true)::int, 0)`
	if err := db.QueryRowContext(context.Background(), q).Scan(&maxConns, &available); err != nil {
		t.Fatal(err)
	}
	return maxConns, available
}

func TestBudgetThatFitsExitsZero(t *testing.T) {
	url := clitest.PostgresURL(t)
	maxConns, available := serverLimit(t)
	r := runQuiet(t, nil, "budget", "--dsn", url, "--instances", "2", "--conns-per-instance", "3", "--other", "1")
	clitest.WantText(t, r.Stdout,
		fmt.Sprintf("max_connections                 %d", maxConns),
		"instances × conns + other ≤ max_connections − reserved",
		fmt.Sprintf("2 × 3 + 1 = 7 ≤ %d − %d = %d", maxConns, maxConns-available, available),
		fmt.Sprintf("verdict: fits, %d connections to spare", available-7),
		"connections in use now:",
		"per instance: 3 connections (--conns-per-instance)",
	)
}

func TestBudgetThatDoesNotFitExitsOne(t *testing.T) {
	url := clitest.PostgresURL(t)
	maxConns, available := serverLimit(t)
	// max_connections is at most 262143: a million never fits.
	r := runCmd(t, nil, "budget", "--dsn", url, "--instances", "1000", "--conns-per-instance", "1000")
	if r.Code != cli.ExitFinding || r.Stderr != "" {
		t.Fatalf("exit %d, stderr %q; want 1 and nothing\n%s", r.Code, r.Stderr, r.Stdout)
	}
	clitest.WantText(t, r.Stdout,
		fmt.Sprintf("1000 × 1000 + 0 = 1000000 > %d − %d = %d", maxConns, maxConns-available, available),
		fmt.Sprintf("verdict: OVER BUDGET by %d connections", 1000000-available),
	)
}

func TestBudgetTakesConnectionsPerInstanceFromThePolicy(t *testing.T) {
	vars := map[string]string{"DATABASE_URL": clitest.PostgresURL(t), cli.EnvMaxConcurrent: "3", cli.EnvMaxQueue: "9"}
	r := runOK(t, vars, "budget", "--instances", "2", "--max-queue", "2")
	// B = 3, whatever Q: the gate keeps no more free than it can run.
	clitest.WantText(t, r.Stdout,
		"per instance: 3 connections (B = 3: the operations running and the free server connections the gate keeps for them)",
		"assumes: the application's own server connections come on top: one per *sql.Conn it keeps open and per Ping, Prepare or Raw running at once",
		"the gate keeps no more server connections than database/sql keeps connections",
		"2 × 3 + 0 = 6 ≤",
	)
}

func TestBudgetListsConnectionsInUseByApplication(t *testing.T) {
	url := clitest.PostgresURL(t)
	probe := fmt.Sprintf("bulkhead_budget_probe_%d", os.Getpid()) // two test runs at once must not see each other's
	db := sql.OpenDB(serverConnector(t, probe))
	defer db.Close()
	conn := testkit.Conn(t, context.Background(), db)
	defer conn.Close()
	r := runOK(t, nil, "budget", "--dsn", url, "--conns-per-instance", "1")
	if !strings.Contains(r.Stdout, probe) {
		t.Fatalf("the probe's connection is not listed:\n%s", r.Stdout)
	}
	if strings.Contains(r.Stdout, budgetAppName(budgetSeq.Load())+" ") {
		t.Fatalf("the check counted its own connection:\n%s", r.Stdout)
	}
}

func TestBudgetSubtractsReservedConnectionsWhereTheServerHasThem(t *testing.T) {
	// PostgreSQL 16 and later: reserved_connections counts too.
	b := budgetCheck{
		srv:       &serverFacts{version: "16.4", maxConnections: 100, superReserved: 3, reserved: 5, reservedExists: true},
		conns:     instanceConns{perInstance: 20, perWhy: "--conns-per-instance"},
		instances: 4, other: 12, otherGiven: true,
	}
	var out bytes.Buffer
	b.print(&out, "postgres://h/db")
	clitest.WantText(t, out.String(), "reserved_connections            5", "available to applications       92", "4 × 20 + 12 = 92 ≤ 100 − 8 = 92", "fits, 0 connections to spare")
	if !b.fits() {
		t.Error("92 ≤ 92 must fit")
	}
	b.other = 13
	if b.fits() {
		t.Error("93 > 92 must not fit")
	}
}

func TestBudgetRejectsBadInput(t *testing.T) {
	wantBadInput(t, "budget", []badInput{
		{"no database", nil, nil, []string{"needs a PostgreSQL server", "--dsn postgres://"}},
		{"mysql", nil, []string{"--dsn", "mysql://root@127.0.0.1:3306/test"}, []string{"needs a PostgreSQL server", "mysql://root@127.0.0.1:3306/test"}},
		{"bad scheme", nil, []string{"--dsn", "http://h/db"}, []string{"--dsn", "http://h/db", "postgres://"}},
		{"zero instances", nil, []string{"--instances", "0"}, []string{"--instances is 0"}},
		{"too many instances", nil, []string{"--instances", "2000000"}, []string{"--instances is 2000000"}},
		{"negative other", nil, []string{"--other", "-3"}, []string{"--other is -3"}},
		{"zero conns", nil, []string{"--conns-per-instance", "0"}, []string{"--conns-per-instance is 0"}},
		{"bad env", map[string]string{cli.EnvMaxQueue: "lots"}, []string{"--dsn", "postgres://h/db"}, []string{cli.EnvMaxQueue, `"lots"`}},
		{"unreachable", nil, []string{"--dsn", "postgres://postgres@127.0.0.1:1/test?sslmode=disable"}, []string{"postgres://postgres@127.0.0.1:1/test", "cannot connect"}},
	})
}

// joinFleet joins the fleet name with policy p on the test server, one
// round an hour (the test runs them with Sync); the member leaves when
// the test ends.
func joinFleet(t *testing.T, name string, p bulkhead.Policy) *fleet.Member {
	t.Helper()
	m, err := fleet.Join(name, serverConnector(t, ""), p, fleet.Interval(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Gate().OpenDB().Close() }) // leaves the fleet
	return m
}

// budget --fleet shows a live fleet as PostgreSQL sees it: two gates of
// one fleet, each with its share after their rounds.
func TestBudgetShowsALiveFleet(t *testing.T) {
	url := clitest.PostgresURL(t)
	name := fmt.Sprintf("budget-%d", os.Getpid())
	p := bulkhead.Policy{MaxConcurrent: 4, MaxQueue: 2, QueueWait: time.Second}
	ms := []*fleet.Member{joinFleet(t, name, p), joinFleet(t, name, p)}
	// Rounds until each holds its share: the first takes all of T, gives
	// back half when it sees the second, which then takes it.
	for range 2 {
		for _, m := range ms {
			if err := m.Sync(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
	}
	// One operation on the first gate: its server connection is tagged
	// with its id, and idle again.
	if _, err := ms[0].Gate().OpenDB().ExecContext(t.Context(), "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	maxConns, available := serverLimit(t)
	r := runQuiet(t, map[string]string{cli.EnvFleet: name}, "budget", "--dsn", url, "--instances", "3", "--max-concurrent", "4", "--max-queue", "2")
	clitest.WantText(t, r.Stdout,
		"per instance: 2 connections (its coordination session and its anchor)",
		fmt.Sprintf("once: 4 connections (fleet %s: T = 4 for operations in all and the free server connections kept for them, whatever the members' shares (from BULKHEAD_FLEET=%s))", name, name),
		"assumes: a member whose share is 0 keeps one idle server connection",
		"budget: fleet T + instances × 2 + other ≤ max_connections − reserved",
		fmt.Sprintf("4 + 3 × 2 + 0 = 10 ≤ %d − %d = %d", maxConns, maxConns-available, available),
		fmt.Sprintf("fleet %s, live: 2 instances, 4 slots held of T=4", name),
		"share (slots)  connections (busy)",
	)
	// Each member's line: id, backend pid, client, since, share,
	// connections (busy), what it reported.
	for i, m := range ms {
		s, f := m.Gate().Stats(), m.Stats()
		if s.MaxConcurrent != 2 || f.Share != 2 || f.Instances != 2 {
			t.Fatalf("a gate of the fleet has B=%d, share %d of %d instances; want 2 of 2", s.MaxConcurrent, f.Share, f.Instances)
		}
		conns := "0 (0)"
		if i == 0 {
			conns = "1 (0)"
		}
		line := regexp.MustCompile(fmt.Sprintf(`(?m)^  %d +%d +\S+ +\S+ \S+ +2 +%s +t=4 b=\d `, f.ID, f.Backend, regexp.QuoteMeta(conns)))
		if !line.MatchString(r.Stdout) {
			t.Errorf("output lacks instance %d's line (%s):\n%s", i, line, r.Stdout)
		}
	}
	// A check told a smaller T finds the fleet over it.
	r = runCmd(t, nil, "budget", "--dsn", url, "--fleet", name, "--max-concurrent", "3", "--max-queue", "0")
	if r.Code != cli.ExitFinding || !strings.Contains(r.Stdout, "fleet: OVER T by 1 (4 slots held, 0 orphans, T=3)") {
		t.Fatalf("T=3 against 4 slots held: exit %d\n%s", r.Code, r.Stdout)
	}
	// An orphan: a session tagged with the id of no member, in a
	// transaction (a killed instance's work still running). It is counted
	// against T with the slots.
	tx := testkit.Begin(t, t.Context(), openServer(t))
	defer tx.Rollback()
	testkit.Exec(t, t.Context(), tx, "SELECT pg_advisory_lock_shared($1, 12345)", fleet.LockKeys(name).Conns)
	r = runCmd(t, nil, "budget", "--dsn", url, "--fleet", name, "--max-concurrent", "4", "--max-queue", "0")
	if r.Code != cli.ExitFinding || !strings.Contains(r.Stdout, "orphans: 1 busy connections beyond their instance's slots") || !strings.Contains(r.Stdout, "fleet: OVER T by 1 (4 slots held, 1 orphans, T=4)") {
		t.Fatalf("T=4 against 4 slots held and an orphan: exit %d\n%s", r.Code, r.Stdout)
	}
}

// Under adaptive, B is the ceiling of the B in force: the connections an
// instance can have open are counted from it, as without.
func TestBudgetCountsAnAdaptivePolicyAtItsCeiling(t *testing.T) {
	fixed := connsPerInstance(bulkhead.Policy{MaxConcurrent: 3, MaxQueue: 2}, "")
	c := connsPerInstance(bulkhead.Policy{MaxConcurrent: 3, MaxQueue: 2, Adaptive: true, MinConcurrent: 1}, "")
	if c.perInstance != 3 || fixed.perInstance != 3 || !strings.HasPrefix(c.perWhy, fixed.perWhy) ||
		!strings.Contains(c.perWhy, "adaptive: B=3 is the ceiling of the B in force") || strings.Contains(fixed.perWhy, "adaptive") {
		t.Errorf("adaptive %+v, fixed %+v: want B = 3 each, the ceiling named under adaptive", c, fixed)
	}
}

// What budget counts per instance of a fleet is what a member holds
// outside its gate: the sessions holding its membership lock and its
// anchor, read from pg_locks.
func TestBudgetCountsTheSessionsEachFleetMemberHoldsOutsideItsGate(t *testing.T) {
	name := fmt.Sprintf("budget-own-%d", os.Getpid())
	p := bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: time.Second}
	m := joinFleet(t, name, p)
	if err := m.Sync(t.Context()); err != nil {
		t.Fatal(err)
	}
	db := openServer(t)
	k := fleet.LockKeys(name)
	var held int
	if err := db.QueryRowContext(t.Context(), `SELECT count(DISTINCT pid) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
		AND granted AND classid::int8 IN ($1, $2) AND objid::int8 = $3`, int64(uint32(k.Members)), int64(uint32(k.Anchors)), m.Stats().ID).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if c := connsPerInstance(p, name); c.perInstance != held {
		t.Errorf("budget counts %d per instance (%s); a member holds %d sessions outside its gate", c.perInstance, c.perWhy, held)
	}
}
