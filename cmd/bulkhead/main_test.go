package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The fleet command starts its members as its own program again: in
	// the tests, this test binary, which then runs the member and exits.
	if len(os.Args) > 1 && os.Args[1] == fleetMemberCmd {
		main()
	}
	goleak.VerifyTestMain(m)
}

// Servers of the real-server tests; the variables override the defaults.
const (
	envTestPostgres = "BULKHEAD_TEST_DATABASE_URL"
	envTestMySQL    = "BULKHEAD_TEST_MYSQL_URL"
)

// postgresURL returns the PostgreSQL server for real-server tests. Under
// -short the test is skipped.
func postgresURL(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs PostgreSQL; skipped under -short")
	}
	if u := os.Getenv(envTestPostgres); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// mysqlURL returns the MariaDB/MySQL server for real-server tests. Under
// -short the test is skipped.
func mysqlURL(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs MariaDB; skipped under -short")
	}
	if u := os.Getenv(envTestMySQL); u != "" {
		return u
	}
	return "mysql://root@127.0.0.1:3306/test"
}

// result is what one command run printed and returned.
type result struct {
	code           int
	stdout, stderr string
}

// runCmd runs the command with args and the environment vars only (the
// process environment is not read), stderr not a terminal.
func runCmd(t *testing.T, vars map[string]string, args ...string) result {
	t.Helper()
	return runCmdCtx(t, context.Background(), vars, nil, args...)
}

func runCmdCtx(t *testing.T, ctx context.Context, vars map[string]string, stderr io.Writer, args ...string) result {
	t.Helper()
	return runCmdTerm(t, ctx, vars, stderr, false, args...)
}

// runCmdTerm is runCmdCtx with stderr a terminal or not.
func runCmdTerm(t *testing.T, ctx context.Context, vars map[string]string, stderr io.Writer, tty bool, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	var ew io.Writer = &errb
	if stderr != nil {
		ew = io.MultiWriter(&errb, stderr)
	}
	e := &env{
		stdout: &out,
		stderr: ew,
		lookup: func(k string) (string, bool) {
			v, ok := vars[k]
			return v, ok
		},
		environ: func() []string {
			var kv []string
			for k, v := range vars {
				kv = append(kv, k+"="+v)
			}
			return kv
		},
		isTerminal: func(io.Writer) bool { return tty },
	}
	code := e.run(ctx, args)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

// wantOneLineError checks that r failed with exit code 2 and exactly one
// line on stderr, prefixed "bulkhead:" once and containing every want.
func wantOneLineError(t *testing.T, r result, want ...string) {
	t.Helper()
	if r.code != exitError {
		t.Errorf("exit code %d, want %d (stdout %q, stderr %q)", r.code, exitError, r.stdout, r.stderr)
	}
	line := strings.TrimSuffix(r.stderr, "\n")
	if strings.Contains(line, "\n") || !strings.HasPrefix(line, "bulkhead: ") || strings.Count(line, "bulkhead: ") != 1 {
		t.Errorf("stderr is not one line prefixed once with \"bulkhead: \": %q", r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(line, w) {
			t.Errorf("stderr %q does not name %q", line, w)
		}
	}
}

func TestEveryCommandHasHelpWithExamples(t *testing.T) {
	for _, cmd := range []string{"demo", "load", "overload", "budget", "policy", "version"} {
		for _, flag := range []string{"--help", "-h"} {
			r := runCmd(t, nil, cmd, flag)
			if r.code != exitOK || r.stderr != "" {
				t.Errorf("%s %s: exit %d, stderr %q; want 0 and nothing", cmd, flag, r.code, r.stderr)
			}
			for _, want := range []string{"Usage: bulkhead " + cmd, "Flags:", "Examples:\n  bulkhead"} {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("%s %s: help lacks %q:\n%s", cmd, flag, want, r.stdout)
				}
			}
		}
	}
}

func TestTopLevelHelpListsTheCommands(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"--help"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	for _, cmd := range []string{"bulkhead demo", "bulkhead load", "bulkhead overload", "bulkhead budget", "bulkhead policy", "bulkhead version", "Exit status"} {
		if !strings.Contains(out.String(), cmd) {
			t.Errorf("usage lacks %q", cmd)
		}
	}
}

func TestNoCommandIsAUsageError(t *testing.T) {
	r := runCmd(t, nil)
	if r.code != exitError || !strings.Contains(r.stderr, "Usage:") {
		t.Fatalf("exit %d, stderr %q; want 2 and the usage", r.code, r.stderr)
	}
}

func TestUnknownCommandIsNamed(t *testing.T) {
	wantOneLineError(t, runCmd(t, nil, "frobnicate"), `"frobnicate"`, "demo, load, overload, fleet, budget, policy or version")
}

func TestBadFlagsAndArgumentsAreNamedForEveryCommand(t *testing.T) {
	for _, cmd := range []string{"demo", "load", "overload", "budget", "policy", "version"} {
		wantOneLineError(t, runCmd(t, nil, cmd, "--no-such-flag"), cmd+":", "unknown flag --no-such-flag", "--help")
		wantOneLineError(t, runCmd(t, nil, cmd, "stray"), cmd+":", `"stray"`)
	}
}

func TestErrorsAreOneLineWithThePrefixOnce(t *testing.T) {
	err := fmt.Errorf("load: %w", errors.New("bulkhead: failed to connect:\n\t127.0.0.1:1: refused\n\t::1: refused"))
	got := oneLine(err)
	want := "bulkhead: load: failed to connect: 127.0.0.1:1: refused ::1: refused"
	if got != want {
		t.Fatalf("oneLine = %q, want %q", got, want)
	}
}
