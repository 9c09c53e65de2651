package tests

// A throwaway PostgreSQL cluster for restart and crash tests: the shared
// server on :5432 is never restarted. The cluster is initialised in the
// test's temporary directory, listens on a free port of 127.0.0.1 with its
// socket in that directory, and is stopped with -m immediate at the end of
// the test. As root, initdb and pg_ctl run as the postgres user (initdb
// refuses root).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/pgxgate"
)

type relCluster struct {
	bin  string // $(pg_config --bindir)
	dir  string // socket directory and parent of data
	data string
	port int
	url  string
	user *user.User // the user that runs the server, nil: this process's user
}

// relStartCluster initialises and starts a cluster for t, stopped (-m
// immediate) when t ends. It skips under -short, like every real-server
// test, and when PostgreSQL's server binaries are not installed here.
func relStartCluster(t *testing.T) *relCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("needs PostgreSQL's server binaries; skipped under -short")
	}
	out, err := exec.Command("pg_config", "--bindir").Output()
	if err != nil {
		t.Skipf("pg_config not found (%v): PostgreSQL's server binaries are needed for a throwaway cluster", err)
	}
	c := &relCluster{bin: strings.TrimSpace(string(out)), dir: t.TempDir()}
	c.data = filepath.Join(c.dir, "data")
	if os.Geteuid() == 0 {
		c.user, err = user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root, the cluster needs the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(c.user.Uid)
		gid, _ := strconv.Atoi(c.user.Gid)
		// t.TempDir's parent is private to root: let postgres through.
		if err := os.Chmod(filepath.Dir(c.dir), 0o711); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(c.dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(c.dir) + len("/.s.PGSQL.65535"); n >= 107 {
		t.Fatalf("socket path %s/.s.PGSQL.* is too long (%d bytes) for a Unix socket", c.dir, n)
	}
	c.port = relFreePort(t)
	c.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
	c.run(t, "initdb", "-D", c.data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C", "-N")
	t.Cleanup(func() { c.stop(t, "immediate") })
	c.start(t)
	return c
}

func relFreePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// run runs one of the cluster's binaries, as postgres when root.
func (c *relCluster) run(t *testing.T, prog string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	path := filepath.Join(c.bin, prog)
	var cmd *exec.Cmd
	if c.user != nil {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", c.user.Username, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	cmd.Dir = c.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(c.dir, "log"))
		t.Fatalf("%s %s: %v\n%s\nserver log:\n%s", prog, strings.Join(args, " "), err, out, log)
	}
}

func (c *relCluster) start(t *testing.T) {
	t.Helper()
	c.run(t, "pg_ctl", "-D", c.data, "-l", filepath.Join(c.dir, "log"), "-w", "-t", "60",
		"-o", fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1", c.port, c.dir), "start")
}

// stop stops the server with mode fast or immediate (a crash).
func (c *relCluster) stop(t *testing.T, mode string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(c.data, "postmaster.pid")); err != nil {
		return // not running
	}
	c.run(t, "pg_ctl", "-D", c.data, "-m", mode, "-w", "-t", "60", "stop")
}

// restart stops the server with mode and starts it again (crash recovery
// after immediate).
func (c *relCluster) restart(t *testing.T, mode string) {
	t.Helper()
	c.stop(t, mode)
	c.start(t)
}

// config is a pgx config for the cluster with the test's application_name.
func (c *relCluster) config(t *testing.T) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(c.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = relAppName(t)
	return cfg
}

// dropIdle closes the idle (now dead) connections of the rig's ungated
// pools after a restart.
func (r *relRig) dropIdle() {
	for _, db := range []*sql.DB{r.ctl, r.mon.db} {
		db.SetMaxIdleConns(0)
		db.SetMaxIdleConns(2)
	}
}

// relUntilServes retries op (bounded) while the first calls after a restart
// fail on stale connections; each failure must be an error, not a
// rejection, and must give its permits back.
func relUntilServes(r *relRig, what string, op func(context.Context) error) {
	t := r.t
	t.Helper()
	var errs []string
	for range 8 {
		ctx, cancel := context.WithTimeout(context.Background(), relBound)
		err := op(ctx)
		cancel()
		if err == nil {
			if len(errs) > 0 {
				t.Logf("%s: served after %d failures: %s", what, len(errs), strings.Join(errs, "; "))
			}
			return
		}
		if errors.Is(err, bulkhead.ErrRejected) {
			t.Fatalf("%s: rejected after a restart: %v (gate %+v)", what, err, r.g.Stats())
		}
		errs = append(errs, err.Error())
		if s := r.g.Stats(); s.Running != 0 {
			t.Fatalf("%s: Running=%d after a failed call", what, s.Running)
		}
	}
	t.Fatalf("%s: still failing after a restart: %s", what, strings.Join(errs, "; "))
}

// ---------------------------------------------------------------------------
// 7. Restart, crash and downtime of the server.

func TestCommittedRowsSurviveRestartCrashAndDowntime(t *testing.T) {
	c := relStartCluster(t)
	p := bulkhead.Policy{MaxConcurrent: 2, MaxQueue: 2, QueueWait: 5 * time.Second}

	for _, mode := range []string{"fast", "immediate"} {
		t.Run("restart -m "+mode+" mid-transaction", func(t *testing.T) {
			r, table, ctx := relOpen(t, p, relRigOptions{cfg: c.config(t), serverURL: c.url})
			if err := r.insertTx(ctx, table, 1); err != nil {
				t.Fatal(err)
			}
			// In flight at the restart: an open transaction with a row, and
			// an autocommit statement running.
			tx := r.holdRow(ctx, table, 2)
			running := goExec(r.db, ctx, "SELECT pg_sleep(60)")
			r.serverUntil("the statement runs", relActive, 1)

			c.restart(t, mode)
			r.dropIdle()

			if err := relAwait(t, "statement running at the restart", running); err == nil {
				t.Error("a statement running across the restart succeeded")
			}
			if err := tx.Commit(); err == nil {
				t.Error("a transaction open across the restart committed")
			}
			if s := r.g.Stats(); s.Running != 0 {
				t.Errorf("P: Running=%d once the in-flight work failed", s.Running)
			}
			relUntilServes(r, "transaction after the restart", func(ctx context.Context) error {
				return r.insertTx(ctx, table, 3)
			})
			r.wantIDs(table, 1, 3)
			r.finish()
		})
	}

	t.Run("server down", func(t *testing.T) {
		r, table, ctx := relOpen(t, p, relRigOptions{cfg: c.config(t), serverURL: c.url})
		if err := r.insertTx(ctx, table, 1); err != nil {
			t.Fatal(err)
		}
		// A fresh gated DB, so every call must dial.
		freshCfg := c.config(t)
		freshCfg.RuntimeParams["application_name"] = "bf_" + strings.TrimPrefix(relAppName(t), "bh_")
		fresh := newRelRig(t, p, relRigOptions{cfg: freshCfg, serverURL: c.url})
		c.stop(t, "fast")

		// Waves of B+Q concurrent callers, three times: each must fail to
		// dial (connection refused), none be rejected. A failed dial that
		// kept its connection slot (the gate counts dials in progress
		// against B+Q) would turn the next wave into rejections.
		bq := p.MaxConcurrent + p.MaxQueue
		call := func(db *sql.DB, id int64) error {
			return relWithTx(ctx, db, func(tx *sql.Tx) error { return relInsert(ctx, tx, table, id) })
		}
		for wave := range 3 {
			errs := make(chan error, bq)
			for i := range bq {
				go func() { errs <- call(fresh.db, int64(100+10*wave+i)) }()
			}
			for range bq {
				if err := relAwait(t, "caller while the server is down", errs); !errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, bulkhead.ErrRejected) {
					t.Errorf("wave %d: err = %v, want connection refused", wave, err)
				}
			}
			if fs := fresh.g.Stats(); fs.OpenConns != 0 {
				t.Errorf("wave %d: OpenConns=%d after failed dials", wave, fs.OpenConns)
			}
		}
		// A burst beyond the bound on both gates (one with a stale idle
		// connection): every caller gets an error at once (refused dial,
		// stale connection, or admission full while B+Q dials are in
		// progress), none hangs and none succeeds.
		seen := map[string]int{}
		errs := make(chan error, 6*bq)
		for i := range 3 * bq {
			for _, db := range []*sql.DB{r.db, fresh.db} {
				go func() { errs <- call(db, int64(200+i)) }()
			}
		}
		for range 6 * bq {
			err := relAwait(t, "caller while the server is down", errs)
			switch {
			case err == nil:
				t.Error("a transaction succeeded while the server was down")
			case errors.Is(err, bulkhead.ErrAdmissionFull):
				seen["admission full"]++
			case errors.Is(err, syscall.ECONNREFUSED):
				seen["connection refused"]++
			default:
				seen["other: "+err.Error()]++
			}
		}
		t.Logf("figures: burst of %d callers while down: %v", 6*bq, seen)
		if fs := fresh.g.Stats(); fs.OpenConns != 0 || fs.Admitted != 0 || fs.Running != 0 {
			t.Errorf("fresh gate after failed dials: %+v; want no connection and no admission", fs)
		}

		c.start(t)
		r.dropIdle()
		fresh.dropIdle()
		for i, rr := range []*relRig{r, fresh} {
			relUntilServes(rr, "transaction after the server came back", func(ctx context.Context) error {
				return relWithTx(ctx, rr.db, func(tx *sql.Tx) error { return relInsert(ctx, tx, table, int64(10+i)) })
			})
		}
		r.wantIDs(table, 1, 10, 11)
		fresh.finish()
		r.finish()
	})
}

// After a server restart every idle connection is dead. database/sql
// finds each by failing an operation on it (pgx pings only a connection
// idle for more than a second); the gate pings its idle connections once
// one of them was found dead, so only the first operation fails. With the
// same number of idle connections (4), through plain database/sql, the
// gate over stdlib.GetConnector, and pgxgate's connector.
func TestAfterARestartTheFirstOperationsFailNoMoreOftenThanThroughPlainDatabaseSQL(t *testing.T) {
	c := relStartCluster(t)
	const idle = 4
	p := bulkhead.Policy{MaxConcurrent: idle, MaxQueue: 0} // the gate keeps at most B free sessions
	ctx := t.Context()
	// failures runs operations one after the other until one succeeds
	// (bounded) and returns how many failed first.
	failures := func(db *sql.DB) int {
		t.Helper()
		for n := range 3 * idle {
			var v int
			err := db.QueryRowContext(ctx, "SELECT 1").Scan(&v)
			if err == nil {
				return n
			}
			if errors.Is(err, bulkhead.ErrRejected) {
				t.Fatalf("rejected after a restart: %v", err)
			}
		}
		t.Fatalf("still failing after %d operations", 3*idle)
		return 0
	}

	// pgx pings a connection idle for more than a second before reusing
	// it, which finds a dead one without failing an operation; whether the
	// restart took longer than that is up to the machine. Never pinging
	// on reset takes that out of the comparison.
	noPing := stdlib.OptionShouldPing(func(context.Context, stdlib.ShouldPingParams) bool { return false })
	plain := plainDB(t, stdlib.GetConnector(*c.config(t), noPing))
	plain.SetMaxIdleConns(idle)
	gStd, std := gateOn(t, stdlib.GetConnector(*c.config(t), noPing), p)
	gPgx, viaPgxgate := gateOn(t, pgxgate.Connector(c.config(t), noPing), p)
	for _, db := range []*sql.DB{plain, std, viaPgxgate} {
		pgWarm(t, ctx, db, idle)
	}
	if s1, s2 := gStd.Stats(), gPgx.Stats(); s1.IdleConns != idle || s2.IdleConns != idle {
		t.Fatalf("idle server connections before the restart: %d and %d, want %d", s1.IdleConns, s2.IdleConns, idle)
	}
	c.restart(t, "fast")

	plainFailed, stdFailed, pgxFailed := failures(plain), failures(std), failures(viaPgxgate)
	t.Logf("figures: operations failed after a restart with %d idle connections: plain database/sql %d, gate over stdlib %d (%+v), pgxgate %d (%+v)",
		idle, plainFailed, stdFailed, gStd.Stats(), pgxFailed, gPgx.Stats())
	if stdFailed > plainFailed || pgxFailed > plainFailed {
		t.Errorf("the gate failed more operations than plain database/sql: %d and %d, plain %d", stdFailed, pgxFailed, plainFailed)
	}
	if stdFailed > 1 || pgxFailed > 1 {
		t.Errorf("after the first failure the gate should have found the other dead connections: %d and %d failed", stdFailed, pgxFailed)
	}
}
