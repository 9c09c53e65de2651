package main

import (
	"strings"
	"testing"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli/clitest"
)

const demoOutput = "overload=rejected\nquery=42\navailable=1\n"

func wantDemoOutput(t *testing.T, r result) {
	t.Helper()
	if r.Code != cli.ExitOK || r.Stdout != demoOutput || r.Stderr != "" {
		t.Fatalf("exit %d\nstdout %q\nstderr %q\nwant exit 0, stdout %q, nothing on stderr", r.Code, r.Stdout, r.Stderr, demoOutput)
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
	wantDemoOutput(t, runCmd(t, nil, "demo", "--dsn", clitest.PostgresURL(t)))
}

func TestDemoTakesPostgreSQLFromDatabaseURL(t *testing.T) {
	wantDemoOutput(t, runCmd(t, map[string]string{"DATABASE_URL": clitest.PostgresURL(t)}, "demo"))
}

func TestDemoOnMariaDBPrintsTheThreeLines(t *testing.T) {
	wantDemoOutput(t, runCmd(t, nil, "demo", "--dsn", clitest.MySQLURL(t)))
}

func TestDemoFlagOverridesDatabaseURL(t *testing.T) {
	// DATABASE_URL points nowhere; --dsn (here: an unreachable MySQL
	// port) is the one used, and named.
	r := runCmd(t, map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none"},
		"demo", "--dsn", "mysql://root@127.0.0.1:1/test")
	clitest.WantOneLineError(t, r, "mysql://root@127.0.0.1:1/test", "cannot connect")
}

func TestDemoRejectsBadInput(t *testing.T) {
	cases := []badInput{
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
			clitest.WantOneLineError(t, r, c.want...)
			if strings.Contains(r.Stderr, "secret") || strings.Contains(r.Stderr, "tiger") {
				t.Errorf("stderr shows a password: %q", r.Stderr)
			}
			if r.Stdout != "" {
				t.Errorf("stdout %q, want nothing", r.Stdout)
			}
		})
	}
}
