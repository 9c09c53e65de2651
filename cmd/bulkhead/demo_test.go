package main

import (
	"strings"
	"testing"
	"time"
)

const demoOutput = "overload=rejected\nquery=42\navailable=1\n"

func wantDemoOutput(t *testing.T, r result) {
	t.Helper()
	if r.code != exitOK || r.stdout != demoOutput || r.stderr != "" {
		t.Fatalf("exit %d\nstdout %q\nstderr %q\nwant exit 0, stdout %q, nothing on stderr", r.code, r.stdout, r.stderr, demoOutput)
	}
}

func TestDemoOnEmbeddedSQLitePrintsTheThreeLines(t *testing.T) {
	wantDemoOutput(t, runCmd(t, nil, "demo"))
}

func TestDemoRunsAgainOnAFreshDatabase(t *testing.T) {
	// Each run opens its own in-memory database: nothing is left over.
	for range 3 {
		wantDemoOutput(t, runCmd(t, nil, "demo"))
	}
}

func TestDemoOnPostgreSQLPrintsTheThreeLines(t *testing.T) {
	wantDemoOutput(t, runCmd(t, nil, "demo", "--dsn", postgresURL(t)))
}

func TestDemoTakesPostgreSQLFromDatabaseURL(t *testing.T) {
	wantDemoOutput(t, runCmd(t, map[string]string{"DATABASE_URL": postgresURL(t)}, "demo"))
}

func TestDemoOnMariaDBPrintsTheThreeLines(t *testing.T) {
	wantDemoOutput(t, runCmd(t, nil, "demo", "--dsn", mysqlURL(t)))
}

func TestDemoFlagOverridesDatabaseURL(t *testing.T) {
	// DATABASE_URL points nowhere; --dsn (here: an unreachable MySQL
	// port) is the one used, and named.
	r := runCmd(t, map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"},
		"demo", "--dsn", "mysql://root@127.0.0.1:1/test")
	wantOneLineError(t, r, "mysql://root@127.0.0.1:1/test", "cannot connect")
}

func TestDemoRejectsBadInput(t *testing.T) {
	cases := []struct {
		name string
		vars map[string]string
		args []string
		want []string
	}{
		{"unknown scheme", nil, []string{"--dsn", "mongodb://h/db"}, []string{"--dsn", `"mongodb://h/db"`, "postgres://", "mysql://"}},
		{"not a URL", nil, []string{"--dsn", "host=x user=y"}, []string{"--dsn", `"host=x user=y"`, "not a URL", "postgres://"}},
		{"empty flag", nil, []string{"--dsn", ""}, []string{"--dsn is empty", "postgres://"}},
		{"bad port", nil, []string{"--dsn", "postgres://u:secret@h:notaport/db"}, []string{"--dsn", "postgres://u:xxxxx@h:notaport/db", "PostgreSQL URL"}},
		{"bad mysql param", nil, []string{"--dsn", "mysql://root@127.0.0.1/test?timeout=soon"}, []string{"--dsn", "MySQL URL", "mysql://"}},
		{"bad DATABASE_URL", map[string]string{"DATABASE_URL": "oracle://scott:tiger@h/db"}, nil, []string{"DATABASE_URL", "oracle://scott:xxxxx@h/db", "postgres://"}},
		{"unreachable postgres", nil, []string{"--dsn", "postgres://postgres@127.0.0.1:1/test?sslmode=disable"}, []string{"postgres://postgres@127.0.0.1:1/test", "cannot connect"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runCmd(t, c.vars, append([]string{"demo"}, c.args...)...)
			wantOneLineError(t, r, c.want...)
			if strings.Contains(r.stderr, "secret") || strings.Contains(r.stderr, "tiger") {
				t.Errorf("stderr shows a password: %q", r.stderr)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
		})
	}
}

func TestMySQLURLBecomesTheDriverConfig(t *testing.T) {
	tg, err := parseTarget("--dsn", "mysql://app:p%40ss@db.example:3307/shop?parseTime=true")
	if err != nil {
		t.Fatal(err)
	}
	c := tg.my
	if tg.dialect != dialectMySQL || c.User != "app" || c.Passwd != "p@ss" || c.Net != "tcp" ||
		c.Addr != "db.example:3307" || c.DBName != "shop" || !c.ParseTime || c.Timeout != connectTimeout {
		t.Fatalf("config %+v", c)
	}
	tg, err = parseTarget("--dsn", "mysql://root@127.0.0.1/test?timeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	if tg.my.Addr != "127.0.0.1:3306" || tg.my.Timeout != 2*time.Second {
		t.Fatalf("default port or timeout: %+v", tg.my)
	}
}

func TestPostgresURLKeepsItsApplicationNameForTheDemo(t *testing.T) {
	tg, err := parseTarget("--dsn", "postgresql://u@h:5433/db?application_name=mine")
	if err != nil {
		t.Fatal(err)
	}
	if tg.dialect != dialectPostgres || tg.pg.Port != 5433 || tg.pg.ConnectTimeout != connectTimeout {
		t.Fatalf("config %+v", tg.pg)
	}
	if _, err := tg.connector("bulkhead-demo", true); err != nil {
		t.Fatal(err)
	}
	if got := tg.pg.RuntimeParams["application_name"]; got != "mine" {
		t.Fatalf("the target's config was changed: application_name %q", got)
	}
}

func TestRedactHidesPasswords(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:secret@h/db":       "postgres://u:xxxxx@h/db",
		"postgres://u:secret@h:bad/db":   "postgres://u:xxxxx@h:bad/db",
		"mysql://root@h:3306/db":         "mysql://root@h:3306/db",
		"postgres://u:s%zz@h/db":         "postgres://u:xxxxx@h/db",
		"mongodb://a:b@h/db?x=1":         "mongodb://a:xxxxx@h/db?x=1",
		"postgres://postgres@h/test?x=1": "postgres://postgres@h/test?x=1",
	} {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}
