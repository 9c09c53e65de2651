package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/fleet"
)

const budgetUsage = `Usage: bulkhead budget --dsn postgres://... [--instances N] [--conns-per-instance C | policy flags] [--other K]

Checks the connection budget of a live PostgreSQL server:

  instances × connections per instance + other ≤ max_connections − reserved

where reserved is superuser_reserved_connections plus reserved_connections
(PostgreSQL 16 and later). Count instances at their peak: autoscaling
maximum plus the overlap of a rolling deploy. Connections per instance are
--conns-per-instance, else what a gate of the policy keeps open:

  B   a logical connection of database/sql holds a server connection
      only while an operation on it holds its permits (at most B), and
      the gate closes one given back when the free ones would outnumber
      B less the operations running, whatever database/sql keeps idle

plus, on top, one per *sql.Conn the application keeps open (from its
first use until Close) and per Ping, Prepare or Raw running at once:
give B plus those in --conns-per-instance. With a fleet (--fleet or
BULKHEAD_FLEET), B is the whole fleet's T, which bounds the fleet's
operations and the free server connections the members keep for them,
and each instance adds the two sessions of package fleet, its
coordination session and its anchor:

  T + instances × 2 + other ≤ max_connections − reserved

(a member whose share is 0 keeps one idle server connection, and the
members' *sql.Conn kept open and Ping, Prepare or Raw come on top: pass
them in --other); and the fleet is shown live, as the database sees it: each instance
alive, its share (the slots it holds), its connections, what it reported
at the start of its last round (T, B, Q, running, waiting), and the slots
held and orphans against T. Exit 1 also when they exceed T.

It also lists the connections in use now by application_name and user.
Exit 0 when the budget fits, 1 when it does not, 2 on an error.
`

const budgetExamples = `  bulkhead budget --dsn postgres://postgres@127.0.0.1:5432/test --instances 6 --max-concurrent 4 --max-queue 4
  bulkhead budget --dsn postgres://postgres@127.0.0.1:5432/test --instances 12 --conns-per-instance 10 --other 15
  BULKHEAD_MAX_CONCURRENT=8 BULKHEAD_MAX_QUEUE=8 DATABASE_URL=postgres://app@db:5432/app bulkhead budget --instances 4
  BULKHEAD_FLEET=orders BULKHEAD_MAX_CONCURRENT=8 BULKHEAD_MAX_QUEUE=8 bulkhead budget --dsn postgres://app@db:5432/app --instances 8
`

// budgetLimit bounds the numeric flags of budget, so that the products
// cannot overflow.
const budgetLimit = 1_000_000

// instanceConns is what a policy lets an instance have open on the
// server: perInstance each, and shared once for a whole fleet.
type instanceConns struct {
	perInstance int
	perWhy      string
	shared      int    // a fleet's T; 0 outside a fleet
	sharedWhy   string // what shared is
	assumes     string
	dryRun      bool // nothing bounds the connections
}

// connsPerInstance counts the server connections behind a gate of
// policy p (in the fleet named, if any): B for the gate's own work (the
// operations running and the free server connections kept for them); in
// a fleet, T for the whole fleet's, plus each member's coordination
// session and anchor (package fleet).
func connsPerInstance(p bulkhead.Policy, fleet string) instanceConns {
	b := p.MaxConcurrent
	if p.DryRun {
		return instanceConns{dryRun: true}
	}
	if fleet != "" {
		return instanceConns{
			perInstance: 2, perWhy: "its coordination session and its anchor",
			shared: b, sharedWhy: fmt.Sprintf("fleet %s: T = %d for operations in all and the free server connections kept for them, whatever the members' shares", fleet, b),
			assumes: "a member whose share is 0 keeps one idle server connection, and the members' own *sql.Conn kept open and " +
				"Ping, Prepare or Raw running at once come on top: pass those in --other",
		}
	}
	perWhy := fmt.Sprintf("B = %d: the operations running and the free server connections the gate keeps for them", b)
	if p.Adaptive {
		perWhy += fmt.Sprintf("; adaptive: B=%d is the ceiling of the B in force", b)
	}
	return instanceConns{
		perInstance: b,
		perWhy:      perWhy,
		assumes: "the application's own server connections come on top: one per *sql.Conn it keeps open and per Ping, Prepare or Raw " +
			"running at once (give B plus those in --conns-per-instance); the gate keeps no more server connections than database/sql " +
			"keeps connections",
	}
}

// policyCell is the policy command's cell for the connections.
func (c instanceConns) policyCell() string {
	switch {
	case c.dryRun:
		return "no bound\tin dry-run the gate runs every operation, each with its server connection: one per operation in flight"
	case c.shared > 0:
		return fmt.Sprintf("its share of T, + 2\tthe fleet's: T = %d for operations in all, + 2 per instance: its coordination session and its anchor", c.shared)
	}
	return fmt.Sprintf("%d\t%s, + 1 per *sql.Conn kept open and per Ping, Prepare or Raw running at once", c.perInstance, c.perWhy)
}

func (e *env) budget(ctx context.Context, args []string) int {
	fs := e.NewFlagSet("budget", budgetUsage, budgetExamples)
	dsn := fs.String("dsn", "", "PostgreSQL URL postgres://...")
	instances := fs.Int("instances", 1, "peak number of application instances (autoscaling maximum plus rolling-deploy overlap)")
	conns := fs.Int("conns-per-instance", 0, "server connections one instance can have open (default B of the policy)")
	other := fs.Int("other", 0, "connections of other clients (jobs, admin tools, replicas' tools, ...)")
	pi := e.AddPolicyFlags(fs)
	set, code, done := pi.Parse(args)
	if done {
		return code
	}
	if *instances < 1 || *instances > budgetLimit {
		return e.Fail(fmt.Errorf("budget: --instances is %d, want 1 to %d", *instances, budgetLimit))
	}
	if *other < 0 || *other > budgetLimit {
		return e.Fail(fmt.Errorf("budget: --other is %d, want 0 to %d", *other, budgetLimit))
	}
	ic := instanceConns{perInstance: *conns, perWhy: "--conns-per-instance"}
	fleetName := ""
	if set["conns-per-instance"] {
		if ic.perInstance < 1 || ic.perInstance > budgetLimit {
			return e.Fail(fmt.Errorf("budget: --conns-per-instance is %d, want 1 to %d", ic.perInstance, budgetLimit))
		}
		// The connections are given: the policy is not read.
		for _, name := range []string{cli.SetB, cli.SetQ, cli.SetDryRun, cli.SetAdaptive, cli.SetMinB, cli.SetFleet} {
			if set[name] {
				return e.Fail(fmt.Errorf("budget: --%s does nothing with --conns-per-instance, which gives the connections per instance; want one or the other", name))
			}
		}
	} else {
		r, err := pi.ResolveChecked(set, bulkhead.DefaultPolicy, (*cli.Resolved).CheckAdaptive)
		if err != nil {
			return e.Fail(fmt.Errorf("budget: %w", err))
		}
		p := r.P
		if p.MaxConcurrent > budgetLimit || p.MaxQueue > budgetLimit {
			return e.Fail(fmt.Errorf("budget: B is %d and Q %d, want each at most %d", p.MaxConcurrent, p.MaxQueue, budgetLimit))
		}
		if p.DryRun {
			return e.Fail(fmt.Errorf("budget: dry run (%s): a gate in dry-run runs every operation, each with its server connection, so B does not bound an instance's connections; want --conns-per-instance, or --dry-run=false", r.Describe(cli.SetDryRun)))
		}
		fleetName = r.Fleet
		ic = connsPerInstance(p, fleetName)
		if fleetName != "" {
			ic.sharedWhy += " (" + r.Describe(cli.SetFleet) + ")"
		}
	}
	t, err := e.ResolveTarget(*dsn, set["dsn"])
	if err != nil {
		return e.Fail(fmt.Errorf("budget: %w", err))
	}
	if t.Dialect != cli.DialectPostgres {
		return e.Fail(fmt.Errorf("budget: needs a PostgreSQL server, got %s; give --dsn postgres://user@host:5432/database or set DATABASE_URL", t.Display))
	}
	readCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	srv, err := readServer(readCtx, t, fleetName)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(e.Stderr, "bulkhead: budget: interrupted")
			return cli.ExitInterrupted
		}
		return e.Fail(fmt.Errorf("budget: %s: %w", t.Display, err))
	}
	b := budgetCheck{srv: srv, conns: ic, instances: *instances, other: *other, otherGiven: set["other"]}
	b.print(e.Stdout, t.Display)
	fleetOK := true
	if fleetName != "" {
		fleetOK = srv.fleet.print(e.Stdout, fleetName, ic.shared)
	}
	if !b.fits() || !fleetOK {
		return cli.ExitFinding
	}
	return cli.ExitOK
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

// budgetSeq numbers the checks of a process.
var budgetSeq atomic.Int64

// budgetAppName is the application_name of check n's own connection,
// with the process id: two checks at once, or one and the connection of
// the one before that the server has not ended yet, tell their
// connections apart.
func budgetAppName(n int64) string { return fmt.Sprintf("bulkhead-budget-%d-%d", os.Getpid(), n) }

func readServer(ctx context.Context, t *cli.Target, fleetName string) (*serverFacts, error) {
	db := sql.OpenDB(t.PlainConnector(budgetAppName(budgetSeq.Add(1))))
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
	if fleetName != "" {
		if f.fleet, err = readFleet(ctx, db, fleetName); err != nil {
			return nil, fmt.Errorf("reading fleet %s from pg_locks: %w", fleetName, err)
		}
	}
	return f, nil
}

// readFleet reads a fleet's members, slots and tagged connections: its
// advisory locks (fleet.LockKeys) and their sessions. The orphans
// are counted as the members count them: the busy connections of an id
// beyond the slots its member holds, all of them for an id with no member.
func readFleet(ctx context.Context, db *sql.DB, name string) (fleetView, error) {
	k := fleet.LockKeys(name)
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
	srv        *serverFacts
	conns      instanceConns
	instances  int
	other      int
	otherGiven bool
}

func (b budgetCheck) need() int {
	return b.conns.shared + b.instances*b.conns.perInstance + b.other
}
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

	c := b.conns
	fmt.Fprintf(w, "\nper instance: %s (%s)\n", connections(c.perInstance), c.perWhy)
	if c.shared > 0 {
		fmt.Fprintf(w, "once: %s (%s)\n", connections(c.shared), c.sharedWhy)
	}
	if c.assumes != "" {
		fmt.Fprintf(w, "assumes: %s\n", c.assumes)
	}
	if !b.otherGiven && s.inUseTotal > 0 {
		fmt.Fprintf(w, "other clients: %d (--other; %d connections are in use now, pass --other to count those that are not this application)\n", b.other, s.inUseTotal)
	}
	verb := "≤"
	if !b.fits() {
		verb = ">"
	}
	if c.shared > 0 {
		fmt.Fprintf(w, "\nbudget: fleet T + instances × %d + other ≤ max_connections − reserved\n", c.perInstance)
		fmt.Fprintf(w, "        %d + %d × %d + %d = %d %s %d − %d = %d\n",
			c.shared, b.instances, c.perInstance, b.other, b.need(), verb,
			s.maxConnections, s.superReserved+s.reserved, b.available())
	} else {
		fmt.Fprintf(w, "\nbudget: instances × conns + other ≤ max_connections − reserved\n")
		fmt.Fprintf(w, "        %d × %d + %d = %d %s %d − %d = %d\n",
			b.instances, c.perInstance, b.other, b.need(), verb,
			s.maxConnections, s.superReserved+s.reserved, b.available())
	}
	if b.fits() {
		fmt.Fprintf(w, "verdict: fits, %d connections to spare\n", b.available()-b.need())
		return
	}
	fmt.Fprintf(w, "verdict: OVER BUDGET by %d connections: lower the instances or B per instance, or raise max_connections (a pooler such as PgBouncer also helps)\n", b.need()-b.available())
}

// connections is "1 connection" or "n connections".
func connections(n int) string {
	if n == 1 {
		return "1 connection"
	}
	return fmt.Sprintf("%d connections", n)
}
