//go:build linux

package tests

// The gate in front of PgBouncer in transaction mode (docs/fleet.md,
// "Behind PgBouncer"). Each test starts its own PgBouncer (Debian's package
// pgbouncer) as a child process on a free port of 127.0.0.1, in front of
// the test server, and stops it when the test ends.

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/fleet"
	"github.com/dbbulkhead/bulkhead/internal/syncbuf"
	"github.com/dbbulkhead/bulkhead/internal/testkit"
)

// pgBouncer is a PgBouncer started by a test.
type pgBouncer struct {
	port   int
	user   string // the server's user, also PgBouncer's admin
	dbname string // the database, under the same name in PgBouncer
	log    *syncbuf.Buffer
	exited chan struct{}
}

// pgBouncerBinary finds pgbouncer: on PATH, or in /usr/sbin where Debian
// installs it (not on every user's PATH).
func pgBouncerBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer"
	}
	t.Fatal("pgbouncer is not installed: on Debian or Ubuntu, apt-get install -y pgbouncer (.ci/run does it); or go test -short to skip the real-server tests")
	return ""
}

var pgbVersionRE = regexp.MustCompile(`PgBouncer (\d+)\.(\d+)(\.\d+)?`)

// startPgBouncer starts a PgBouncer in transaction mode with the given
// default_pool_size in front of the test server, waits until it accepts
// connections, and stops it when t ends. Clients log in as the server's
// user without a password (auth_type trust); PgBouncer logs in to the
// server as the test URL says.
//
// PgBouncer refuses to run as root ("FATAL PgBouncer should not run as
// root"); its -u USER switches user after reading the configuration. As
// root the test starts it as nobody instead, through the process's
// credentials, so that the parent-death signal survives (a credential
// change clears it): a PgBouncer never outlives a test binary killed by
// go test's timeout.
func startPgBouncer(t *testing.T, poolSize int) *pgBouncer {
	t.Helper()
	up, err := pgx.ParseConfig(postgresURL(t)) // skips under -short
	if err != nil {
		t.Fatal(err)
	}
	bin := pgBouncerBinary(t)
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("pgbouncer --version: %v\n%s", err, out)
	}
	m := pgbVersionRE.FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("pgbouncer --version: no version in %q", out)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	t.Logf("pgbouncer --version:\n%s", strings.TrimSpace(string(out)))

	dir := t.TempDir()
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("nobody")
		if err != nil {
			t.Fatalf("running as root, PgBouncer needs another user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		// t.TempDir's parent is private to root: let PgBouncer through to
		// its files.
		must(t, os.Chmod(filepath.Dir(dir), 0o711))
		must(t, os.Chown(dir, uid, gid))
	}
	server := fmt.Sprintf("host=%s port=%d dbname=%s user=%s", up.Host, up.Port, up.Database, up.User)
	if up.Password != "" {
		server += " password=" + up.Password
	}
	userlist := filepath.Join(dir, "userlist.txt")
	pgbWriteFile(t, userlist, fmt.Sprintf("%q \"\"\n", up.User), cred)
	b := &pgBouncer{user: up.User, dbname: up.Database}
	// The port is free when chosen, but another process may take it
	// before PgBouncer binds it: then it exits, and another port is tried.
	for attempt := 1; ; attempt++ {
		b.port = relFreePort(t)
		ini := fmt.Sprintf(`[databases]
%s = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
admin_users = %s
pool_mode = transaction
default_pool_size = %d
logfile =
pidfile =
`, up.Database, server, b.port, userlist, up.User, poolSize)
		// Server-side prepared statements in transaction mode came with
		// PgBouncer 1.21 (max_prepared_statements, off by default); earlier
		// versions refuse the setting ("unknown parameter").
		if major > 1 || major == 1 && minor >= 21 {
			ini += "max_prepared_statements = 0\n"
		}
		conf := filepath.Join(dir, "pgbouncer.ini")
		pgbWriteFile(t, conf, ini, cred)
		b.log = &syncbuf.Buffer{}
		b.exited = make(chan struct{})
		cmd := exec.Command(bin, conf)
		cmd.Stdout, cmd.Stderr = b.log, b.log
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start pgbouncer: %v", err)
		}
		var waitErr error
		go func() {
			waitErr = cmd.Wait()
			close(b.exited)
		}()
		if b.awaitReady(t) {
			t.Cleanup(func() {
				_ = cmd.Process.Signal(syscall.SIGTERM) // immediate shutdown
				select {
				case <-b.exited:
				case <-time.After(10 * time.Second):
					_ = cmd.Process.Kill()
					<-b.exited
				}
				if t.Failed() {
					t.Logf("pgbouncer log:\n%s", b.log.String())
				}
			})
			return b
		}
		<-b.exited
		if attempt < 5 && strings.Contains(b.log.String(), "Address already in use") {
			continue
		}
		t.Fatalf("pgbouncer exited (%v):\n%s", waitErr, b.log.String())
	}
}

func pgbWriteFile(t *testing.T, path, content string, cred *syscall.Credential) {
	t.Helper()
	must(t, os.WriteFile(path, []byte(content), 0o600))
	if cred != nil {
		must(t, os.Chown(path, int(cred.Uid), int(cred.Gid)))
	}
}

// awaitReady waits until this PgBouncer listens (its log says so: the
// port is not another process's) and its admin console answers, or until
// it exits (false). A bounded loop: it fails the test if neither happens.
func (b *pgBouncer) awaitReady(t *testing.T) bool {
	t.Helper()
	listening := fmt.Sprintf("listening on 127.0.0.1:%d", b.port)
	last := errors.New("not listening yet")
	for range 500 {
		if strings.Contains(b.log.String(), listening) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			c, err := pgx.ConnectConfig(ctx, b.adminConfig(t))
			if err == nil {
				_, err = c.Exec(ctx, "SHOW VERSION")
				c.Close(ctx)
			}
			cancel()
			if err == nil {
				return true
			}
			last = err
		}
		select {
		case <-b.exited:
			return false
		case <-time.After(10 * time.Millisecond): // pacing between looks
		}
	}
	t.Fatalf("pgbouncer on port %d does not answer: %v\n%s", b.port, last, b.log.String())
	return false
}

func (b *pgBouncer) url(db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", url.PathEscape(b.user), b.port, url.PathEscape(db))
}

// adminConfig is PgBouncer's admin console, which speaks only the simple
// query protocol.
func (b *pgBouncer) adminConfig(t *testing.T) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(b.url("pgbouncer"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	return cfg
}

// config is a pgx config for the test database through PgBouncer, with
// the test's application_name (PgBouncer passes it on to the server) and
// the given query mode.
func (b *pgBouncer) config(t *testing.T, mode pgx.QueryExecMode) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(b.url(b.dbname))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = appName(t)
	cfg.DefaultQueryExecMode = mode
	return cfg
}

// admin opens a connection to the admin console, closed when t ends.
func (b *pgBouncer) admin(t *testing.T, ctx context.Context) *pgBouncerAdmin {
	t.Helper()
	c, err := pgx.ConnectConfig(ctx, b.adminConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return &pgBouncerAdmin{c: c, db: b.dbname}
}

type pgBouncerAdmin struct {
	c  *pgx.Conn
	db string
}

// show runs SHOW <what> and returns its rows as column → text: those of
// the test database when the rows name one.
func (a *pgBouncerAdmin) show(t *testing.T, ctx context.Context, what string) []map[string]string {
	t.Helper()
	rows, err := a.c.Query(ctx, "SHOW "+what)
	if err != nil {
		t.Fatalf("SHOW %s: %v", what, err)
	}
	defer rows.Close()
	var out []map[string]string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			t.Fatal(err)
		}
		r := map[string]string{}
		for i, fd := range rows.FieldDescriptions() {
			r[fd.Name] = fmt.Sprint(vals[i])
		}
		if db, ok := r["database"]; !ok || db == a.db {
			out = append(out, r)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("SHOW %s: %v", what, err)
	}
	return out
}

// pool returns the test database's row of SHOW POOLS.
func (a *pgBouncerAdmin) pool(t *testing.T, ctx context.Context) map[string]string {
	t.Helper()
	rows := a.show(t, ctx, "POOLS")
	if len(rows) != 1 {
		t.Fatalf("SHOW POOLS: %d rows for database %s, want 1", len(rows), a.db)
	}
	return rows[0]
}

// serverPIDs returns the backend pids of PgBouncer's server connections.
func (a *pgBouncerAdmin) serverPIDs(t *testing.T, ctx context.Context) []string {
	t.Helper()
	var pids []string
	for _, r := range a.show(t, ctx, "SERVERS") {
		pids = append(pids, r["remote_pid"])
	}
	return pids
}

func pgbAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}

// ---------------------------------------------------------------------------

func pgbGate(t *testing.T, c driver.Connector, p bulkhead.Policy, opts ...bulkhead.Option) *bulkhead.Gate {
	t.Helper()
	g, err := bulkhead.New(c, p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.OpenDB().Close() }) // closes the gate too
	return g
}

// pgbQuery runs q with argument n on c and returns its int result.
func pgbQuery(ctx context.Context, c *sql.Conn, q string, n int) (int, error) {
	var got int
	err := c.QueryRowContext(ctx, q, n).Scan(&got)
	return got, err
}

// pgbOutcome is "ok" or the SQLSTATE of a PostgreSQL error.
func pgbOutcome(t *testing.T, err error) string {
	t.Helper()
	if err == nil {
		return "ok"
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		t.Fatalf("not a PostgreSQL error: %v", err)
	}
	return pe.Code
}

var stmtcacheRE = regexp.MustCompile(`^prepared statement "(stmtcache_[0-9a-f]+)" (already exists|does not exist)$`)

// TestPgBouncerStatementCache: pgx's default query mode,
// QueryExecModeCacheStatement, prepares each statement once per
// connection under a name derived from its SQL text and then only binds
// it. In transaction mode PgBouncer gives each transaction (each statement
// outside one) whichever server connection is free, and without
// prepared-statement support in the pooler (PgBouncer before 1.21, or
// max_prepared_statements = 0) a named statement lives on the server
// connection where it was parsed, whichever client parsed it.
//
// Deterministically, with default_pool_size = 1 (two sessions of the gate,
// two PgBouncer clients, one server connection): the second session's
// Parse of the same name fails with 42P05 "already exists", at every
// attempt; once the server connection is replaced (RECONNECT on the admin
// console, as server_lifetime or server_idle_timeout do), the first
// session's cached statement fails with 26000 "does not exist". The gate
// passes these errors through: it neither causes nor hides them.
// QueryExecModeExec and the simple protocol send the statement with every
// execution and work throughout.
func TestPgBouncerStatementCache(t *testing.T) {
	ctx := pgTestCtx(t)
	b := startPgBouncer(t, 1)
	admin := b.admin(t, ctx)
	for _, tc := range []struct {
		name string
		mode pgx.QueryExecMode
		want string // outcomes: session 1, 2, 1, 2 | after RECONNECT: 1, 2, 1, 2
	}{
		// After "does not exist" pgx drops the statement from session 1's
		// cache; session 2 (whose failed Parse cached nothing) parses it on
		// the new server connection; session 1 deallocates the name there
		// and parses it again; session 2 binds the statement session 1
		// made. Same name, same SQL text: the right statement, by luck of
		// the naming.
		{"cache_statement", pgx.QueryExecModeCacheStatement, "ok 42P05 ok 42P05 | 26000 ok ok ok"},
		{"exec", pgx.QueryExecModeExec, "ok ok ok ok | ok ok ok ok"},
		{"simple_protocol", pgx.QueryExecModeSimpleProtocol, "ok ok ok ok | ok ok ok ok"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := pgbGate(t, stdlib.GetConnector(*b.config(t, tc.mode)), bulkhead.Policy{MaxConcurrent: 2})
			db := g.OpenDB()
			// A *sql.Conn keeps its gate session (its PgBouncer client)
			// until closed.
			c1, c2 := takeConn(t, ctx, db), takeConn(t, ctx, db)
			// The SQL text is the subtest's own: the server connection
			// outlives the subtests.
			q := "SELECT $1::int + 1 -- " + tc.name
			var outcomes []string
			names := map[string]bool{}
			round := func() {
				t.Helper()
				for i, c := range []*sql.Conn{c1, c2, c1, c2} {
					got, err := pgbQuery(ctx, c, q, i)
					if err == nil && got != i+1 {
						t.Fatalf("session %d: %d, want %d", i%2+1, got, i+1)
					}
					if err != nil {
						t.Logf("session %d: %v", i%2+1, err)
						var pe *pgconn.PgError
						if errors.As(err, &pe) {
							if m := stmtcacheRE.FindStringSubmatch(pe.Message); m != nil {
								names[m[1]] = true
							} else {
								t.Errorf("session %d: %v, want a prepared statement that already exists or does not exist", i%2+1, err)
							}
						}
					}
					outcomes = append(outcomes, pgbOutcome(t, err))
				}
			}
			round()
			if n := len(admin.show(t, ctx, "CLIENTS")); n != 2 {
				t.Fatalf("%d PgBouncer clients for the test database, want 2", n)
			}
			old := admin.serverPIDs(t, ctx)
			if len(old) != 1 {
				t.Fatalf("PgBouncer's server connections (backend pids) %v, want 1", old)
			}
			if _, err := admin.c.Exec(ctx, "RECONNECT "+b.dbname); err != nil {
				t.Fatal(err)
			}
			awaitState(t, "PgBouncer closed its server connection", func() bool {
				return !slices.Contains(admin.serverPIDs(t, ctx), old[0])
			})
			outcomes = append(outcomes, "|")
			round()
			if got := strings.Join(outcomes, " "); got != tc.want {
				t.Fatalf("outcomes %s, want %s", got, tc.want)
			}
			if len(names) > 1 {
				t.Fatalf("statement names %v, want one: the SQL text's", names)
			}
			if s := g.Stats(); s.Running != 0 || s.OpenConns != 2 {
				t.Fatalf("after the statements: running %d, %d server connections; want 0, 2", s.Running, s.OpenConns)
			}
		})
	}
}

// TestPgBouncerQueue: what the gate adds in front of PgBouncer. With
// default_pool_size = 2 and query_wait_timeout at its default (120 s),
// two transactions hold both server connections: an ungated third
// operation is a third PgBouncer client that waits in PgBouncer's queue
// (SHOW POOLS: cl_waiting = 1) and runs once a transaction ends; the gate
// with B=2, Q=0 rejects it at once with ErrAdmissionFull, and neither
// PgBouncer (2 clients, none waiting) nor the server (2 transactions)
// sees it.
func TestPgBouncerQueue(t *testing.T) {
	ctx := pgTestCtx(t)
	b := startPgBouncer(t, 2)
	admin := b.admin(t, ctx)
	for _, r := range admin.show(t, ctx, "CONFIG") {
		if r["key"] == "query_wait_timeout" {
			t.Logf("query_wait_timeout = %s (default %s)", r["value"], r["default"])
		}
	}
	hold := func(t *testing.T, db *sql.DB) *sql.Tx {
		t.Helper()
		tx := pgBegin(t, ctx, db)
		testkit.Exec(t, ctx, tx, "SELECT 1")
		return tx
	}
	check := func(t *testing.T, what string, mon *monitor, clients, waiting int) {
		t.Helper()
		p := admin.pool(t, ctx)
		if got := fmt.Sprintf("sv_active %s cl_active %s cl_waiting %s", p["sv_active"], p["cl_active"], p["cl_waiting"]); got != fmt.Sprintf("sv_active 2 cl_active 2 cl_waiting %d", waiting) {
			t.Fatalf("%s: SHOW POOLS %s, want 2 server connections in use, 2 clients on them and %d waiting", what, got, waiting)
		}
		if n := len(admin.show(t, ctx, "CLIENTS")); n != clients {
			t.Fatalf("%s: %d PgBouncer clients, want %d", what, n, clients)
		}
		if n := mon.Transactions(t); n != 2 {
			t.Fatalf("%s: %d transactions on the server, want 2", what, n)
		}
	}
	t.Run("ungated", func(t *testing.T) {
		db := plainDB(t, stdlib.GetConnector(*b.config(t, pgx.QueryExecModeExec)))
		mon := newMonitor(t)
		tx1, tx2 := hold(t, db), hold(t, db)
		done := goExec(db, ctx, "SELECT 3")
		awaitState(t, "the third operation waits in PgBouncer's queue", func() bool {
			return pgbAtoi(t, admin.pool(t, ctx)["cl_waiting"]) == 1
		})
		check(t, "third operation waiting", mon, 3, 1)
		select {
		case err := <-done:
			t.Fatalf("the third operation ended (%v) while both server connections are held", err)
		default:
		}
		txCommit(t, tx1)
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("the third operation, once a server connection was free: %v", err)
			}
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		txCommit(t, tx2)
	})
	t.Run("gated", func(t *testing.T) {
		g := pgbGate(t, stdlib.GetConnector(*b.config(t, pgx.QueryExecModeExec)), bulkhead.Policy{MaxConcurrent: 2})
		db := g.OpenDB()
		mon := newMonitor(t)
		tx1, tx2 := hold(t, db), hold(t, db)
		_, err := db.ExecContext(ctx, "SELECT 3")
		if !errors.Is(err, bulkhead.ErrAdmissionFull) || !errors.Is(err, bulkhead.ErrRejected) {
			t.Fatalf("the third operation: %v, want ErrAdmissionFull", err)
		}
		t.Logf("the third operation: %v", err)
		check(t, "third operation rejected", mon, 2, 0)
		if s := g.Stats(); s.OpenConns != 2 || s.Dials != 2 || s.RejectedFull != 1 {
			t.Fatalf("gate: %d connections open, %d dials, %d rejected; want 2, 2, 1", s.OpenConns, s.Dials, s.RejectedFull)
		}
		txCommit(t, tx1)
		if _, err := db.ExecContext(ctx, "SELECT 3"); err != nil {
			t.Fatalf("once a transaction ended: %v", err)
		}
		txCommit(t, tx2)
	})
}

// TestPgBouncerFleet: a fleet budget's coordination session holds
// session-level advisory locks, so it must bypass PgBouncer in transaction
// mode. Through PgBouncer (default_pool_size = 1, so that what happens is
// deterministic: every statement of every client runs on one server
// connection):
//   - two instances count each other (each has a membership lock keyed by
//     its own id), but their slots are held by the same backend, so each
//     counts them all as its own: B = 2 and 2 on 2 slots with T = 4; a
//     third instance coordinating directly finds 2 free slots and takes
//     its share: the three Bs add up to more than T;
//   - one instance's goodbye (pg_advisory_unlock_all) frees the other's
//     locks too: the other runs on with its B and no slot, until its next
//     round fails (its membership lock is gone), drops it to the fallback,
//     and the round after takes the whole T again;
//   - an instance killed with SIGKILL leaves its locks on the server
//     connection, which PgBouncer keeps open for the next client: its
//     slots are never freed (until PgBouncer closes that connection), and a
//     new instance counts it as alive and gets B = 0.
//
// With fleet.Coordinator pointing at PostgreSQL, fleet.Tagging(false)
// and the operations through PgBouncer, two instances with T = 4 settle at
// 2 and 2. Left on, the tags land on PgBouncer's server connection and stay
// there after the instance left: while that connection then serves
// another client's transaction, the fleet counts it as an orphan.
func TestPgBouncerFleet(t *testing.T) {
	ctx := pgTestCtx(t)
	b := startPgBouncer(t, 1)
	bouncer := b.admin(t, ctx)
	admin := adminDB(t)
	inner := stdlib.GetConnector(*b.config(t, pgx.QueryExecModeExec))

	t.Run("coordination through PgBouncer", func(t *testing.T) {
		name := fleetName(t) + "-shared"
		p := fleetPolicy(4, 0)
		g1 := fleetMember(t, name, inner, p)
		fleetSync(t, ctx, g1)
		g2 := fleetMember(t, name, inner, p)
		fleetSync(t, ctx, g1, g2, g1, g2)
		servers := bouncer.serverPIDs(t, ctx)
		if len(servers) != 1 {
			t.Fatalf("PgBouncer's server connections %v, want 1", servers)
		}
		for i, g := range []*fleet.Member{g1, g2} {
			s, fs := g.Gate().Stats(), g.Stats()
			if s.MaxConcurrent != 2 || fs.Instances != 2 || strconv.FormatInt(fs.Backend, 10) != servers[0] {
				t.Fatalf("instance %d: B=%d, %d instances, backend %d; want 2, 2, PgBouncer's server connection %s", i+1, s.MaxConcurrent, fs.Instances, fs.Backend, servers[0])
			}
		}
		v := fleetSlots(t, ctx, admin, name)
		if v.members != 2 || v.total != 2 || v.slots[g1.Stats().Backend] != 2 {
			t.Fatalf("pg_locks: %d membership locks, slots %v; want 2 and 2 held by %s", v.members, v.slots, servers[0])
		}
		t.Logf("two instances, T=4: B = 2 and 2, one backend (pid %s) holding 2 membership locks and 2 slots", servers[0])
		g3 := fleetGate(t, name, p) // coordinating directly
		fleetSync(t, ctx, g3, g3)
		b3 := g3.Gate().Stats().MaxConcurrent
		if v := fleetSlots(t, ctx, admin, name); b3 == 0 || v.total > 4 || 2+2+b3 <= 4 {
			t.Fatalf("a third instance, direct: B=%d, %d slots held; want a share, the slots within T=4 and the Bs over it", b3, v.total)
		}
		t.Logf("a third instance coordinating directly: B=%d; the three Bs add up to %d with T=4", b3, 2+2+b3)
		must(t, g3.Gate().OpenDB().Close())

		must(t, g1.Gate().OpenDB().Close())
		if v := fleetSlots(t, ctx, admin, name); v.members != 0 || v.total != 0 {
			t.Fatalf("after instance 1 left: pg_locks %d membership locks, %d slots; want 0, 0", v.members, v.total)
		}
		if s := g2.Gate().Stats(); s.MaxConcurrent != 2 {
			t.Fatalf("instance 2 after instance 1 left: B=%d, want 2 (no round yet)", s.MaxConcurrent)
		}
		err := g2.Sync(ctx)
		if !errors.Is(err, fleet.ErrCoordination) || !strings.Contains(err.Error(), "membership lock") {
			t.Fatalf("instance 2's round after instance 1 left: %v, want ErrCoordination, its membership lock gone", err)
		}
		t.Logf("instance 2's round after instance 1 left: %v", err)
		if s, fs := g2.Gate().Stats(), g2.Stats(); s.MaxConcurrent != fleet.DefaultFallback || !fs.Degraded {
			t.Fatalf("after the failed round: B=%d, degraded %v; want %d, true", s.MaxConcurrent, fs.Degraded, fleet.DefaultFallback)
		}
		fleetSync(t, ctx, g2)
		if s, fs := g2.Gate().Stats(), g2.Stats(); s.MaxConcurrent != 4 || fs.Degraded {
			t.Fatalf("the round after: B=%d, degraded %v; want 4, false", s.MaxConcurrent, fs.Degraded)
		}
	})

	t.Run("killed instance behind PgBouncer", func(t *testing.T) {
		name := fleetName(t) + "-killed"
		// One instance in a process of its own (fleetChild, T = 8),
		// operations and coordination through PgBouncer.
		c := startFleetChild(t, ctx, name, b.url(b.dbname)+"&default_query_exec_mode=exec")
		pid, share := c.sync()
		if share != 8 {
			t.Fatalf("child: B=%d, want its share of 8", share)
		}
		c.kill()
		awaitState(t, "PgBouncer saw its client go", func() bool { return len(bouncer.show(t, ctx, "CLIENTS")) == 0 })
		if servers := bouncer.serverPIDs(t, ctx); len(servers) != 1 || servers[0] != strconv.FormatInt(pid, 10) {
			t.Fatalf("PgBouncer's server connections %v, want the killed instance's session's backend %d, kept", servers, pid)
		}
		if v := fleetSlots(t, ctx, admin, name); v.members != 1 || v.slots[pid] != 8 {
			t.Fatalf("after the kill: pg_locks %d membership locks, slots %v; want 1 and 8 held by %d", v.members, v.slots, pid)
		}
		// A new instance, coordinating directly with PostgreSQL, counts
		// the dead one and finds no free slot.
		g := fleetGate(t, name, fleetPolicy(8, 0))
		fleetSync(t, ctx, g, g)
		if s, fs := g.Gate().Stats(), g.Stats(); s.MaxConcurrent != 0 || fs.Instances != 2 {
			t.Fatalf("a new instance after the kill: B=%d, %d instances; want 0, 2", s.MaxConcurrent, fs.Instances)
		}
		t.Logf("killed instance (backend %d): its membership lock and 8 slots stay on PgBouncer's server connection; a new instance counts 2 instances and gets B=0", pid)
	})

	t.Run("coordination direct to PostgreSQL", func(t *testing.T) {
		name := fleetName(t) + "-direct"
		p := fleetPolicy(4, 0)
		direct := directCoordination(t)
		untagged := fleet.Tagging(false)
		g1 := fleetMember(t, name, inner, p, direct, untagged)
		fleetSync(t, ctx, g1)
		g2 := fleetMember(t, name, inner, p, direct, untagged)
		gs := []*fleet.Member{g1, g2}
		fleetSync(t, ctx, g1, g2, g1, g2)
		checkFleet(t, ctx, admin, name, 4, gs)
		if bs, _ := shares(gs); fmt.Sprint(bs) != "[2 2]" {
			t.Fatalf("two instances, T=4, after two rounds each: B = %v, want [2 2]", bs)
		}
		servers := bouncer.serverPIDs(t, ctx)
		for i, g := range gs {
			s := g.Stats()
			// The operations still go through PgBouncer.
			testkit.Exec(t, ctx, g.Gate().OpenDB(), "SELECT 1")
			v := fleetSlots(t, ctx, admin, name)
			if s.Instances != 2 || v.slots[s.Backend] != 2 || slices.Contains(servers, strconv.FormatInt(s.Backend, 10)) {
				t.Fatalf("instance %d: %d instances, backend %d holding %d slots (PgBouncer's servers %v); want 2 instances, 2 slots on a backend of its own", i+1, s.Instances, s.Backend, v.slots[s.Backend], servers)
			}
		}
		v := fleetSlots(t, ctx, admin, name)
		if v.members != 2 || v.total != 4 || len(v.tags) != 0 {
			t.Fatalf("pg_locks: %d membership locks, %d slots, tags %v; want 2, 4, none", v.members, v.total, v.tags)
		}
	})

	t.Run("tags behind PgBouncer", func(t *testing.T) {
		name := fleetName(t) + "-tags"
		p := fleetPolicy(4, 0)
		direct := directCoordination(t)
		g1 := fleetMember(t, name, inner, p, direct) // tagging on: the default
		fleetSync(t, ctx, g1)
		testkit.Exec(t, ctx, g1.Gate().OpenDB(), "SELECT 1")
		servers := bouncer.serverPIDs(t, ctx)
		pid, _ := strconv.ParseInt(servers[0], 10, 64)
		if v := fleetSlots(t, ctx, admin, name); len(servers) != 1 || v.tags[pid] != 1 {
			t.Fatalf("after an operation through PgBouncer: tags %v, PgBouncer's servers %v; want 1 tag on its server connection", v.tags, servers)
		}
		must(t, g1.Gate().OpenDB().Close())
		if v := fleetSlots(t, ctx, admin, name); v.members != 0 || v.tags[pid] != 1 {
			t.Fatalf("after the instance left: %d membership locks, tags %v; want 0, the tag still on PgBouncer's server connection %d", v.members, v.tags, pid)
		}
		// Another client of PgBouncer opens a transaction: it runs on
		// that server connection, which the fleet now counts as an
		// orphan.
		other, err := pgx.ConnectConfig(ctx, b.config(t, pgx.QueryExecModeExec))
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close(context.Background())
		tx, err := other.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background())
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		g2 := fleetGate(t, name, p)
		fleetSync(t, ctx, g2)
		if fs, s := g2.Stats(), g2.Gate().Stats(); fs.Orphans != 1 || s.MaxConcurrent != 3 {
			t.Fatalf("a new instance while another client's transaction runs on the tagged server connection: %d orphans, B=%d; want 1, 3", fs.Orphans, s.MaxConcurrent)
		}
		t.Logf("a left instance's tag stays on PgBouncer's server connection %d: while another client's transaction runs there, the fleet counts an orphan (B=3 of T=4)", pid)
	})
}
