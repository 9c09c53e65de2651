package main

import (
	"context"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli/clitest"
)

func TestMain(m *testing.M) {
	// The fleet command starts its members as its own program again: in
	// the tests, this test binary, which then runs the member and exits.
	if len(os.Args) > 1 && os.Args[1] == fleetMemberCmd {
		main()
	}
	goleak.VerifyTestMain(m)
}

// program is this program, run on synthetic environments.
var program = clitest.Program{Name: "experiments", Commands: commands, Run: run}

// runCmd runs the command with args and the environment vars only (the
// process environment is not read), stderr not a terminal.
var runCmd = program.Cmd

// runCmdCtx is runCmd with a context, stderr copied to stderr if not nil.
func runCmdCtx(t *testing.T, ctx context.Context, vars map[string]string, stderr io.Writer, args ...string) clitest.Result {
	t.Helper()
	return program.CmdTerm(t, ctx, vars, stderr, false, args...)
}

// badArgs is a command line that must fail: the arguments after the
// command and what its one-line error names.
type badArgs struct{ args, want []string }

// wantBadArgs runs cmd with each case's args and checks that it fails with
// one line naming "cmd:" and every want.
func wantBadArgs(t *testing.T, cmd string, cases []badArgs) {
	t.Helper()
	for _, c := range cases {
		clitest.WantOneLineError(t, runCmd(t, nil, append([]string{cmd}, c.args...)...), append([]string{cmd + ":"}, c.want...)...)
	}
}

func TestEveryCommandHasHelpWithExamplesAndNamesBadFlags(t *testing.T) {
	program.WantHelp(t, "overload", "fleet")
	top := runCmd(t, nil, "--help")
	for _, want := range []string{"experiments overload", "experiments fleet", "go run ./experiments", "Exit status",
		"BULKHEAD_MAX_CONCURRENT", "(fleet: 8, T: the service's total; overload: the number of CPUs"} {
		if top.Code != cli.ExitOK || !strings.Contains(top.Stdout, want) {
			t.Errorf("exit %d; usage lacks %q:\n%s", top.Code, want, top.Stdout)
		}
	}
	if r := runCmd(t, nil); r.Code != cli.ExitError || !strings.Contains(r.Stderr, "Usage:") {
		t.Errorf("no command: exit %d, stderr %q; want 2 and the usage", r.Code, r.Stderr)
	}
	clitest.WantOneLineError(t, runCmd(t, nil, "load"), `"load"`, "want overload or fleet")
}

func TestHelpShowsTheRealDefaults(t *testing.T) {
	h := runCmd(t, nil, "overload", "--help").Stdout
	if strings.Contains(h, "-1ns") || strings.Contains(h, "(default -1") {
		t.Errorf("overload --help shows a sentinel default:\n%s", h)
	}
	for _, want := range []string{
		"(default deadline − 2·B/C, by the rule, or $BULKHEAD_QUEUE_WAIT)",
		"(default max(B, ⌊C·wait⌋), by the rule, or $BULKHEAD_MAX_QUEUE)",
		"(default the number of CPUs, " + strconv.Itoa(runtime.NumCPU()) + " here, or $BULKHEAD_MAX_CONCURRENT)",
		"(default 100ms)", // --deadline
	} {
		if !strings.Contains(h, want) {
			t.Errorf("overload --help lacks %q:\n%s", want, h)
		}
	}
	program.WantEnvHelp(t)
}

// The policy settings, read as the tool reads them: flag, then variable,
// then default; an unknown BULKHEAD_* variable is an error.
func TestOverloadReadsThePolicyFlagThenEnvironmentThenDefault(t *testing.T) {
	r := runCmd(t, map[string]string{cli.EnvMaxConcurrent: "1", cli.EnvMaxQueue: "4", cli.EnvQueueWait: "3s"},
		"overload", "--capacity", "50", "--loads", "1", "--duration", "100ms", "--warmup", "0s",
		"--capacity-duration", "150ms", "--cpu-rows", "100", "--deadline", "10s", "--configs", "gate",
		"--max-queue", "2", "--json", "-")
	if r.Code != cli.ExitOK {
		t.Fatalf("overload: exit %d, stderr %q", r.Code, r.Stderr)
	}
	rep := clitest.JSON[overloadReport](t, r.Stdout)
	if rep.Rule || rep.Policy != (cli.PolicyJSON{MaxConcurrent: 1, MaxQueue: 2, QueueWaitMs: 3000}) {
		t.Errorf("overload policy %+v (by rule %v), want B=1 from the environment, Q=2 from the flag, wait 3s from the environment", rep.Policy, rep.Rule)
	}
	for _, cmd := range [][]string{{"overload", "--loads", "1"}, {"fleet", "--dsn", testPG}} {
		clitest.WantOneLineError(t, runCmd(t, map[string]string{"BULKHEAD_QUEUEWAIT": "5ms"}, cmd...), cmd[0]+":",
			`unknown environment variable BULKHEAD_QUEUEWAIT="5ms"`, "did you mean BULKHEAD_QUEUE_WAIT?")
	}
}

func TestCtrlCExits130AfterPrintingWhatWasMeasured(t *testing.T) {
	bin := clitest.Build(t)
	clitest.WantCtrlC(t, bin, []string{"overload", "--capacity", "50", "--loads", "1", "--duration", "10m", "--warmup", "0s",
		"--capacity-duration", "150ms", "--cpu-rows", "100", "--deadline", "10s"},
		"overload: S p50", "overload on embedded SQLite", "interrupted")
}
