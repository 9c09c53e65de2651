package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
)

// The pgbouncer arm's PgBouncer: started by the fleet command on a free
// port of 127.0.0.1, in transaction mode, with default_pool_size T, in
// front of the experiment's server, and stopped at the end of the arm.

// pgBouncer is a running PgBouncer.
type pgBouncer struct {
	cmd  *exec.Cmd
	dir  string
	addr string // 127.0.0.1:port
	out  *tailBuffer
	done chan struct{}
	once sync.Once
}

// pgbouncerStart bounds how long PgBouncer may take to accept
// connections.
const pgbouncerStart = 5 * time.Second

// findPgBouncer returns the PgBouncer binary: the one given, else
// pgbouncer in PATH, else Debian's /usr/sbin/pgbouncer (not in every
// PATH).
func findPgBouncer(given string) (string, error) {
	if given != "" {
		p, err := exec.LookPath(given)
		if err != nil {
			return "", fmt.Errorf("--pgbouncer %q: %v; %w", given, err, errNoPgBouncer)
		}
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	const debian = "/usr/sbin/pgbouncer"
	if st, err := os.Stat(debian); err == nil && !st.IsDir() {
		return debian, nil
	}
	return "", errNoPgBouncer
}

// pgbouncerConfig is the configuration file of a PgBouncer listening on
// port in front of t, with pool pool, and its user list. Clients are
// trusted (the server still checks PgBouncer's own login, with the DSN's
// password if it has one).
func pgbouncerConfig(t *cli.Target, dir string, port, pool int) (ini, users string) {
	pg := t.PG
	db := pg.Database
	var srv []string
	srv = append(srv, "host="+pg.Host, "port="+strconv.Itoa(int(pg.Port)), "dbname="+db, "user="+pg.User)
	if pg.Password != "" {
		srv = append(srv, "password="+pg.Password)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "[databases]\n%s = %s\n\n[pgbouncer]\n", db, strings.Join(srv, " "))
	for _, kv := range [][2]string{
		{"listen_addr", "127.0.0.1"},
		{"listen_port", strconv.Itoa(port)},
		{"unix_socket_dir", ""},
		{"auth_type", "trust"},
		{"auth_file", filepath.Join(dir, "userlist.txt")},
		{"pool_mode", "transaction"},
		{"default_pool_size", strconv.Itoa(pool)},
		{"max_db_connections", strconv.Itoa(pool)},
		{"reserve_pool_size", "0"},
		{"min_pool_size", "0"},
		{"max_client_conn", "4000"},
		{"ignore_startup_parameters", "extra_float_digits"},
		{"log_connections", "0"},
		{"log_disconnections", "0"},
		{"log_pooler_errors", "1"},
	} {
		fmt.Fprintf(&b, "%s = %s\n", kv[0], kv[1])
	}
	return b.String(), fmt.Sprintf("%q \"\"\n", pg.User)
}

// startPgBouncer starts PgBouncer and waits until it accepts connections.
// Run as root, it is told to switch to the user nobody: it refuses to run
// as root.
func startPgBouncer(ctx context.Context, bin string, t *cli.Target, pool int, log io.Writer) (*pgBouncer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "bulkhead-pgbouncer-")
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	// Readable by the user PgBouncer switches to.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	ini, users := pgbouncerConfig(t, dir, port, pool)
	iniPath := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(iniPath, []byte(ini), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "userlist.txt"), []byte(users), 0o644); err != nil {
		return nil, err
	}
	args := []string{iniPath}
	if os.Geteuid() == 0 {
		args = []string{"-u", "nobody", iniPath}
	}
	cmd := exec.Command(bin, args...)
	ownProcessGroup(cmd)
	p := &pgBouncer{cmd: cmd, dir: dir, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), out: &tailBuffer{max: 8192}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("cannot start PgBouncer (%s): %w", bin, err)
	}
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	ok = true
	deadline := time.Now().Add(pgbouncerStart)
	for {
		c, err := net.DialTimeout("tcp", p.addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			if err := p.warm(ctx, t, pool); err != nil {
				p.stop()
				return nil, fmt.Errorf("PgBouncer (%s) on %s: %w (%s)", bin, p.addr, err, p.out.lastLine())
			}
			fmt.Fprintf(log, "fleet: PgBouncer %s listening on %s, pool_mode transaction, default_pool_size %d, %d server connections open\n", bin, p.addr, pool, pool)
			return p, nil
		}
		select {
		case <-p.done:
			p.stop()
			return nil, fmt.Errorf("PgBouncer (%s) exited at start: %s", bin, p.out.lastLine())
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("PgBouncer (%s) did not accept connections on %s within %v: %s", bin, p.addr, pgbouncerStart, p.out.lastLine())
		}
	}
}

// warm opens the pool's server connections, as a PgBouncer that has run
// for a while has them: pool transactions at once through it. Left cold,
// the first requests of the arm would wait for PgBouncer's dials to the
// server, and their cancellations would follow them.
func (p *pgBouncer) warm(ctx context.Context, t *cli.Target, pool int) error {
	cfg, err := viaPgBouncer(t, p.addr, "bulkhead-monitor")
	if err != nil {
		return err
	}
	db := sql.OpenDB(stdlib.GetConnector(*cfg))
	defer db.Close()
	db.SetMaxOpenConns(pool)
	ctx, cancel := context.WithTimeout(ctx, 4*cli.ConnectTimeout)
	defer cancel()
	errs := make(chan error, pool)
	for range pool {
		go func() {
			_, err := db.ExecContext(ctx, "SELECT pg_sleep(0.1)")
			errs <- err
		}()
	}
	for range pool {
		if e := <-errs; e != nil && err == nil {
			err = e
		}
	}
	return err
}

// exited reports whether PgBouncer ended on its own, and its last words.
func (p *pgBouncer) exited() (string, bool) {
	select {
	case <-p.done:
		return p.out.lastLine(), true
	default:
		return "", false
	}
}

// viaPgBouncer is t's connection configuration through a PgBouncer at
// addr, with application_name app.
func viaPgBouncer(t *cli.Target, addr, app string) (*pgx.ConnConfig, error) {
	host, port, err := splitHostPort(addr)
	if err != nil {
		return nil, err
	}
	cfg := t.PG.Copy()
	cfg.RuntimeParams["application_name"] = app
	// This PgBouncer has no TLS: plain, as sslmode=prefer falls back to
	// (the fallbacks name the server, not PgBouncer).
	cfg.Host, cfg.Port, cfg.TLSConfig, cfg.Fallbacks = host, port, nil, nil
	// PgBouncer 1.18 in transaction mode keeps no prepared statement from
	// one transaction to the next: no statement cache (pgx's default
	// names statements and reuses them).
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	return cfg, nil
}

// stop ends PgBouncer (SIGTERM, its fast shutdown; SIGKILL after 2 s) and
// removes its files. It may be called more than once.
func (p *pgBouncer) stop() {
	p.once.Do(func() {
		terminate(p.cmd.Process)
		select {
		case <-p.done:
		case <-time.After(2 * time.Second):
			p.cmd.Process.Kill()
			<-p.done
		}
		os.RemoveAll(p.dir)
	})
}

// freePort returns a TCP port of 127.0.0.1 free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, errors.New("no TCP port")
	}
	return addr.Port, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

// lastLine is the last non-empty line written, or "no output".
func (t *tailBuffer) lastLine() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := bytes.Split(bytes.TrimSpace(t.b), []byte("\n"))
	if l := strings.TrimSpace(string(lines[len(lines)-1])); l != "" {
		return l
	}
	return "no output"
}
