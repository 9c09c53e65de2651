package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dbbulkhead/bulkhead"
)

const budgetUsage = `Usage: bulkhead budget --dsn postgres://... --instances N [--conns-per-instance C | policy flags] [--other K]

Checks the connection budget of a live PostgreSQL server:

  instances × connections per instance + other ≤ max_connections − reserved

With a fleet (--fleet or BULKHEAD_FLEET), B+Q are the whole fleet's, and
each instance adds its coordination session:

  B + Q + instances + other ≤ max_connections − reserved

and the fleet is shown live, as the database sees it: each instance alive,
its share (the slots it holds), what it reported at the start of its
last round (T, B, Q, running, waiting), and the slots held against T = B. Exit 1 also when the
slots held exceed T.

where reserved is superuser_reserved_connections plus reserved_connections
(PostgreSQL 16 and later). Count instances at their peak: autoscaling
maximum plus the overlap of a rolling deploy. Connections per instance are
--conns-per-instance, else B+Q of the policy (the gate keeps at most B+Q
open). It also lists the connections in use now by application_name and
user. Exit 0 when the budget fits, 1 when it does not, 2 on an error.
`

const budgetExamples = `  bulkhead budget --dsn postgres://postgres@127.0.0.1:5432/test --instances 6 --max-concurrent 4 --max-queue 4
  bulkhead budget --dsn postgres://postgres@127.0.0.1:5432/test --instances 12 --conns-per-instance 10 --other 15
  BULKHEAD_MAX_CONCURRENT=8 BULKHEAD_MAX_QUEUE=8 DATABASE_URL=postgres://app@db:5432/app bulkhead budget --instances 4
  BULKHEAD_FLEET=orders BULKHEAD_MAX_CONCURRENT=8 BULKHEAD_MAX_QUEUE=8 bulkhead budget --dsn postgres://app@db:5432/app --instances 8
`

// budgetLimit bounds the numeric flags of budget, so that the products
// cannot overflow.
const budgetLimit = 1_000_000

func (e *env) budget(ctx context.Context, args []string) int {
	fs := e.newFlagSet("budget", budgetUsage, budgetExamples)
	dsn := fs.String("dsn", "", "PostgreSQL URL postgres://...")
	instances := fs.Int("instances", 1, "peak number of application instances (autoscaling maximum plus rolling-deploy overlap)")
	conns := fs.Int("conns-per-instance", 0, "connections one instance keeps at most (default B+Q of the policy)")
	other := fs.Int("other", 0, "connections of other clients (jobs, admin tools, replicas' tools, ...)")
	pi := e.addPolicyFlags(fs, unusedSettings["budget"])
	if code, done := e.parseFlags(fs, args); done {
		return code
	}
	set := flagsSet(fs)
	if err := pi.checkUnused(set); err != nil {
		return e.fail(fmt.Errorf("budget: %w", err))
	}
	if *instances < 1 || *instances > budgetLimit {
		return e.fail(fmt.Errorf("budget: --instances is %d, want 1 to %d", *instances, budgetLimit))
	}
	if *other < 0 || *other > budgetLimit {
		return e.fail(fmt.Errorf("budget: --other is %d, want 0 to %d", *other, budgetLimit))
	}
	per, perWhy := *conns, "--conns-per-instance"
	if set["conns-per-instance"] {
		if per < 1 || per > budgetLimit {
			return e.fail(fmt.Errorf("budget: --conns-per-instance is %d, want 1 to %d", per, budgetLimit))
		}
		// The connections are given: the policy is not read.
		for _, name := range []string{setB, setQ, setDryRun, setFleet} {
			if set[name] {
				return e.fail(fmt.Errorf("budget: --%s does nothing with --conns-per-instance, which gives the connections per instance; want one or the other", name))
			}
		}
	}
	var fleet bulkhead.Policy
	if !set["conns-per-instance"] {
		r, err := pi.resolve(e.lookup, set, bulkhead.DefaultPolicy)
		if err != nil {
			return e.fail(fmt.Errorf("budget: %w", err))
		}
		p := r.p
		if p.MaxQueue > math.MaxInt32-p.MaxConcurrent {
			return e.fail(fmt.Errorf("budget: B+Q is %d+%d, want at most %d in all", p.MaxConcurrent, p.MaxQueue, math.MaxInt32))
		}
		if p.DryRun {
			return e.fail(fmt.Errorf("budget: dry run (%s): a gate in dry-run dials beyond B+Q, so B+Q does not bound an instance's connections; want --conns-per-instance, or --dry-run=false", r.describe(setDryRun)))
		}
		per, perWhy = p.MaxConcurrent+p.MaxQueue, fmt.Sprintf("B+Q = %d+%d of the policy", p.MaxConcurrent, p.MaxQueue)
		if per > budgetLimit {
			return e.fail(fmt.Errorf("budget: B+Q is %d, want at most %d", per, budgetLimit))
		}
		if p.Fleet != "" {
			fleet = p
			per, perWhy = 1, fmt.Sprintf("its coordination session; fleet %s (%s) keeps at most B+Q = %d+%d in all", p.Fleet, r.describe(setFleet), p.MaxConcurrent, p.MaxQueue)
		}
	}
	t, err := e.resolveTarget(*dsn, set["dsn"])
	if err != nil {
		return e.fail(fmt.Errorf("budget: %w", err))
	}
	if t.dialect != dialectPostgres {
		return e.fail(fmt.Errorf("budget: needs a PostgreSQL server, got %s; give --dsn postgres://user@host:5432/database or set DATABASE_URL", t.display))
	}
	readCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	srv, err := readServer(readCtx, t, fleet.Fleet)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(e.stderr, "bulkhead: budget: interrupted")
			return exitInterrupted
		}
		return e.fail(fmt.Errorf("budget: %s: %w", t.display, err))
	}
	b := budgetCheck{srv: srv, instances: *instances, perInstance: per, perWhy: perWhy, other: *other, otherGiven: set["other"]}
	if fleet.Fleet != "" {
		b.fleetConns = fleet.MaxConcurrent + fleet.MaxQueue
	}
	b.print(e.stdout, t.display)
	fleetOK := true
	if fleet.Fleet != "" {
		fleetOK = srv.fleet.print(e.stdout, fleet.Fleet, fleet.MaxConcurrent)
	}
	if !b.fits() || !fleetOK {
		return exitFinding
	}
	return exitOK
}

// serverFacts is what budget reads from the server.
type serverFacts struct {
	version        string
	maxConnections int
	superReserved  int
	reserved       int
	reservedExists bool // reserved_connections: PostgreSQL 16 and later
	inUse          []usage
	inUseTotal     int
	fleet          fleetView
}

// fleetView is a fleet as pg_locks and pg_stat_activity show it.
type fleetView struct {
	members []fleetMember
	slots   int // slots held, by members or not
	orphans int // busy tagged connections beyond the slots of their id's member
}

type fleetMember struct {
	id, pid  int64
	client   string
	since    time.Time
	slots    int
	conns    int    // server connections tagged with its id
	busy     int    // of which not idle
	reported string // its application_name, set at its last round
}

type usage struct {
	app, user string
	n         int
}

// budgetAppName is the application_name of the check's own connection,
// with the process id: two checks at once tell their connections apart.
func budgetAppName() string { return fmt.Sprintf("bulkhead-budget-%d", os.Getpid()) }

func readServer(ctx context.Context, t *target, fleet string) (*serverFacts, error) {
	db := sql.OpenDB(t.plainConnector(budgetAppName()))
	defer db.Close()
	db.SetMaxOpenConns(1)
	if err := db.PingContext(ctx); err != nil {
		return nil, fmt.Errorf("cannot connect: %w", err)
	}
	f := &serverFacts{}
	if err := db.QueryRowContext(ctx, "SHOW server_version").Scan(&f.version); err != nil {
		return nil, fmt.Errorf("SHOW server_version: %w", err)
	}
	rows, err := db.QueryContext(ctx, `SELECT name, setting FROM pg_settings
		WHERE name IN ('max_connections', 'superuser_reserved_connections', 'reserved_connections')`)
	if err != nil {
		return nil, fmt.Errorf("reading pg_settings: %w", err)
	}
	seen := map[string]bool{}
	for rows.Next() {
		var name, setting string
		if err := rows.Scan(&name, &setting); err != nil {
			rows.Close()
			return nil, fmt.Errorf("reading pg_settings: %w", err)
		}
		n, err := strconv.Atoi(setting)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("pg_settings %s is %q, want an integer", name, setting)
		}
		seen[name] = true
		switch name {
		case "max_connections":
			f.maxConnections = n
		case "superuser_reserved_connections":
			f.superReserved = n
		case "reserved_connections":
			f.reserved, f.reservedExists = n, true
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading pg_settings: %w", err)
	}
	if !seen["max_connections"] {
		return nil, fmt.Errorf("pg_settings has no max_connections")
	}
	rows, err = db.QueryContext(ctx, `SELECT coalesce(nullif(application_name, ''), '(none)'), coalesce(usename, '(none)'), count(*)
		FROM pg_stat_activity
		WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
		GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("reading pg_stat_activity: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var u usage
		if err := rows.Scan(&u.app, &u.user, &u.n); err != nil {
			return nil, fmt.Errorf("reading pg_stat_activity: %w", err)
		}
		f.inUse = append(f.inUse, u)
		f.inUseTotal += u.n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("reading pg_stat_activity: %w", err)
	}
	if fleet != "" {
		if f.fleet, err = readFleet(ctx, db, fleet); err != nil {
			return nil, fmt.Errorf("reading fleet %s from pg_locks: %w", fleet, err)
		}
	}
	return f, nil
}

// readFleet reads a fleet's members, slots and tagged connections: its
// advisory locks (bulkhead.FleetLockKeys) and their sessions. The orphans
// are counted as the members count them: the busy connections of an id
// beyond the slots its member holds, all of them for an id with no member.
func readFleet(ctx context.Context, db *sql.DB, name string) (fleetView, error) {
	k := bulkhead.FleetLockKeys(name)
	var v fleetView
	rows, err := db.QueryContext(ctx, `SELECT l.classid::int8, l.objid::int8, l.pid,
			coalesce(host(a.client_addr), 'local socket'), coalesce(a.backend_start, now()),
			coalesce(a.application_name, ''), coalesce(a.state, '')
		FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND l.classid::int8 IN ($1, $2, $3)
		ORDER BY 2`, int64(uint32(k.Members)), int64(uint32(k.Slots)), int64(uint32(k.Conns)))
	if err != nil {
		return v, err
	}
	defer rows.Close()
	held := map[int64]int{}                                                  // slots by holder pid
	conns, busy, unseen := map[int64]int{}, map[int64]int{}, map[int64]int{} // tagged connections by id: all, busy, state not seen
	for rows.Next() {
		var class, obj, pid int64
		var client, app, state string
		var since time.Time
		if err := rows.Scan(&class, &obj, &pid, &client, &since, &app, &state); err != nil {
			return v, err
		}
		switch class {
		case int64(uint32(k.Members)):
			v.members = append(v.members, fleetMember{id: obj, pid: pid, client: client, since: since, reported: strings.TrimPrefix(app, "bulkhead fleet ")})
		case int64(uint32(k.Slots)):
			held[pid]++
			v.slots++
		default:
			conns[obj]++
			switch state {
			case "idle":
			case "": // another role's, without pg_read_all_stats
				unseen[obj]++
			default:
				busy[obj]++
			}
		}
	}
	if err := rows.Err(); err != nil {
		return v, err
	}
	for i := range v.members {
		m := &v.members[i]
		m.slots, m.conns, m.busy = held[m.pid], conns[m.id], busy[m.id]
		v.orphans += max(0, m.busy-m.slots)
		delete(busy, m.id)
		delete(unseen, m.id)
	}
	for id, n := range busy {
		v.orphans += n + unseen[id]
		delete(unseen, id)
	}
	for _, n := range unseen {
		v.orphans += n
	}
	return v, nil
}

// print shows the fleet; it returns false when its slots and orphans
// exceed T.
func (v fleetView) print(w io.Writer, name string, total int) bool {
	fmt.Fprintf(w, "\nfleet %s, live: %d instances, %d slots held of T=%d\n", name, len(v.members), v.slots, total)
	if len(v.members) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  id\tbackend pid\tclient\tsince\tshare (slots)\tconnections (busy)\treported at the start of its last round\n")
		for _, m := range v.members {
			fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\t%d\t%d (%d)\t%s\n", m.id, m.pid, m.client, m.since.Format(time.DateTime), m.slots, m.conns, m.busy, m.reported)
		}
		tw.Flush()
	}
	if v.orphans > 0 {
		fmt.Fprintf(w, "orphans: %d busy connections beyond their instance's slots (a killed instance's, or one's without coordination): the shares leave room for them until they end\n", v.orphans)
	}
	if v.slots+v.orphans > total {
		fmt.Fprintf(w, "fleet: OVER T by %d (%d slots held, %d orphans, T=%d): the instances were given a larger T than this check's --max-concurrent, or T was lowered and they have not given the slots back yet\n", v.slots+v.orphans-total, v.slots, v.orphans, total)
		return false
	}
	return true
}

// budgetCheck is the inequality with its numbers.
type budgetCheck struct {
	srv         *serverFacts
	fleetConns  int // a fleet's B+Q, counted once; 0 outside a fleet
	instances   int
	perInstance int
	perWhy      string
	other       int
	otherGiven  bool
}

func (b budgetCheck) need() int { return b.fleetConns + b.instances*b.perInstance + b.other }
func (b budgetCheck) available() int {
	return b.srv.maxConnections - b.srv.superReserved - b.srv.reserved
}
func (b budgetCheck) fits() bool { return b.need() <= b.available() }

func (b budgetCheck) print(w io.Writer, where string) {
	s := b.srv
	fmt.Fprintf(w, "server: PostgreSQL %s at %s\n\n", s.version, where)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "max_connections\t%d\n", s.maxConnections)
	fmt.Fprintf(tw, "superuser_reserved_connections\t%d\n", s.superReserved)
	if s.reservedExists {
		fmt.Fprintf(tw, "reserved_connections\t%d\n", s.reserved)
	} else {
		fmt.Fprintf(tw, "reserved_connections\t-\t(not on this server: PostgreSQL 16 and later)\n")
	}
	fmt.Fprintf(tw, "available to applications\t%d\t= %d − %d − %d\n", b.available(), s.maxConnections, s.superReserved, s.reserved)
	tw.Flush()

	fmt.Fprintf(w, "\nconnections in use now: %d (this check's own not counted)\n", s.inUseTotal)
	if len(s.inUse) > 0 {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  application_name\tusename\tconnections\n")
		for _, u := range s.inUse {
			fmt.Fprintf(tw, "  %s\t%s\t%d\n", u.app, u.user, u.n)
		}
		tw.Flush()
	}

	fmt.Fprintf(w, "\nper instance: %d connections (%s)\n", b.perInstance, b.perWhy)
	if !b.otherGiven && s.inUseTotal > 0 {
		fmt.Fprintf(w, "other clients: %d (--other; %d connections are in use now, pass --other to count those that are not this application)\n", b.other, s.inUseTotal)
	}
	verb := "≤"
	if !b.fits() {
		verb = ">"
	}
	if b.fleetConns > 0 {
		fmt.Fprintf(w, "\nbudget: fleet B+Q + instances × 1 + other ≤ max_connections − reserved\n")
		fmt.Fprintf(w, "        %d + %d × %d + %d = %d %s %d − %d = %d\n",
			b.fleetConns, b.instances, b.perInstance, b.other, b.need(), verb,
			s.maxConnections, s.superReserved+s.reserved, b.available())
	} else {
		fmt.Fprintf(w, "\nbudget: instances × conns + other ≤ max_connections − reserved\n")
		fmt.Fprintf(w, "        %d × %d + %d = %d %s %d − %d = %d\n",
			b.instances, b.perInstance, b.other, b.need(), verb,
			s.maxConnections, s.superReserved+s.reserved, b.available())
	}
	if b.fits() {
		fmt.Fprintf(w, "verdict: fits, %d connections to spare\n", b.available()-b.need())
		return
	}
	fmt.Fprintf(w, "verdict: OVER BUDGET by %d connections: lower the instances or B+Q per instance, or raise max_connections (a pooler such as PgBouncer also helps)\n", b.need()-b.available())
}
