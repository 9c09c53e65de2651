package main

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli/clitest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// program is this program, run on synthetic environments.
var program = clitest.Program{Name: "bulkhead", Commands: commands, Run: run}

type result = clitest.Result

// runCmd runs the command with args and the environment vars only (the
// process environment is not read), stderr not a terminal.
var runCmd = program.Cmd

// runOK is runCmd that stops the test unless the command exits 0.
func runOK(t *testing.T, vars map[string]string, args ...string) result {
	t.Helper()
	r := runCmd(t, vars, args...)
	if r.Code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %q\n%s", r.Code, r.Stderr, r.Stdout)
	}
	return r
}

// runQuiet is runOK that also stops the test unless stderr is empty.
func runQuiet(t *testing.T, vars map[string]string, args ...string) result {
	t.Helper()
	r := runOK(t, vars, args...)
	if r.Stderr != "" {
		t.Fatalf("exit %d, stderr %q, want nothing\n%s", r.Code, r.Stderr, r.Stdout)
	}
	return r
}

// badInput is a command line that must fail: the environment, the
// command's arguments and what its one-line error names.
type badInput struct {
	name string
	vars map[string]string
	args []string
	want []string
}

// wantBadInput runs cmd with each case and checks that it fails with one
// line naming "cmd:" and every want.
func wantBadInput(t *testing.T, cmd string, cases []badInput) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runCmd(t, c.vars, append([]string{cmd}, c.args...)...)
			clitest.WantOneLineError(t, r, append([]string{cmd + ":"}, c.want...)...)
		})
	}
}

func TestEveryCommandHasHelpWithExamplesAndNamesBadFlags(t *testing.T) {
	program.WantHelp(t, "demo", "load", "budget", "policy", "version")
}

func TestTopLevelHelpListsTheCommands(t *testing.T) {
	var out, errb bytes.Buffer
	e := &cli.Env{Name: "bulkhead", Stdout: &out, Stderr: &errb, Commands: commands}
	if code := run(context.Background(), e, []string{"--help"}); code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	for _, cmd := range []string{"bulkhead demo", "bulkhead load", "bulkhead budget", "bulkhead policy", "bulkhead version", "Exit status",
		"go run ./experiments", "default embedded SQLite (budget: none: required)"} {
		if !strings.Contains(out.String(), cmd) {
			t.Errorf("usage lacks %q:\n%s", cmd, out.String())
		}
	}
}

func TestNoCommandIsAUsageError(t *testing.T) {
	r := runCmd(t, nil)
	if r.Code != cli.ExitError || !strings.Contains(r.Stderr, "Usage:") {
		t.Fatalf("exit %d, stderr %q; want 2 and the usage", r.Code, r.Stderr)
	}
}

func TestUnknownCommandIsNamed(t *testing.T) {
	clitest.WantOneLineError(t, runCmd(t, nil, "frobnicate"), `"frobnicate"`, "demo, load, budget, policy or version")
	// The experiments left the tool: they are named where they are now.
	for _, cmd := range []string{"overload", "fleet"} {
		clitest.WantOneLineError(t, runCmd(t, nil, cmd, "--help"), cmd+" is not a command of this tool: it is an experiment", "go run ./experiments "+cmd)
	}
}

func TestCtrlCExits130AfterPrintingWhatWasMeasured(t *testing.T) {
	bin := clitest.Build(t)
	clitest.WantCtrlC(t, bin, []string{"load", "--clients", "2", "--duration", "10m", "--hold", "2ms", "--deadline", "10m",
		"--max-concurrent", "1", "--max-queue", "1", "--queue-wait", "10m", "--progress", "1ns"},
		"gated ", "attempted", "(interrupted)")
}

// openServer opens an ungated *sql.DB on the test server, closed at the
// end of the test.
func openServer(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", clitest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// serverConnector is pgx's connector to the test server, with
// application_name app unless app is "".
func serverConnector(t *testing.T, app string) driver.Connector {
	t.Helper()
	cfg, err := pgx.ParseConfig(clitest.PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	if app != "" {
		cfg.RuntimeParams["application_name"] = app
	}
	return stdlib.GetConnector(*cfg)
}
