package main

import (
	"fmt"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli/clitest"
)

// libraryEnv returns the BULKHEAD_* names the library's policy.go reads.
func libraryEnv(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../policy.go")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range regexp.MustCompile(`"(BULKHEAD_[A-Z_]+)"`).FindAllStringSubmatch(string(b), -1) {
		if m[1] != "BULKHEAD_TEST_" { // the prefix of the test suites' variables
			names = append(names, m[1])
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) < 6 {
		t.Fatalf("found only %v in policy.go", names)
	}
	return names
}

func TestTheToolKnowsEveryVariableTheLibraryReads(t *testing.T) {
	lib := libraryEnv(t)
	known := slices.Sorted(slices.Values(cli.KnownEnv()))
	if !slices.Equal(known, lib) {
		t.Fatalf("the tool knows %v, the library reads %v", known, lib)
	}
	help := runCmd(t, nil, "--help").Stdout
	for _, name := range lib {
		if !strings.Contains(help, name) {
			t.Errorf("the top-level help does not list %s", name)
		}
	}
	program.WantEnvHelp(t)
}

// As bulkhead.PolicyFromEnv does, every command that reads the policy
// refuses a BULKHEAD_* variable that no setting names, with the library's
// words: its name, its value and the nearest known name. The test suites'
// BULKHEAD_TEST_* are not the tool's; the demo reads no policy.
func TestUnknownBulkheadVariableIsAnErrorNamingTheNearestKnownOne(t *testing.T) {
	vars := map[string]string{"BULKHEAD_MAX_QUEU": "3", "BULKHEAD_TEST_DATABASE_URL": "postgres://x", "OTHER": "1"}
	r := runCmd(t, vars, "policy")
	clitest.WantOneLineError(t, r, "policy:", `unknown environment variable BULKHEAD_MAX_QUEU="3"`, "did you mean BULKHEAD_MAX_QUEUE?")
	if r.Stdout != "" || strings.Contains(r.Stderr, "BULKHEAD_TEST_") {
		t.Errorf("stdout %q; stderr %q names the test suites' variable", r.Stdout, r.Stderr)
	}
	// The test suites' variables alone are no error.
	runQuiet(t, map[string]string{"BULKHEAD_TEST_DATABASE_URL": "postgres://x"}, "policy")
	// Every command that reads the policy refuses it the same way, before
	// it connects; budget --conns-per-instance and the demo read none.
	bad := map[string]string{"BULKHEAD_DRYRUN": "true"}
	for _, args := range [][]string{
		{"load", "--clients", "1", "--count", "1", "--hold", "0s", "--progress", "0"},
		{"budget", "--dsn", "postgres://nobody@127.0.0.1:1/none"},
	} {
		clitest.WantOneLineError(t, runCmd(t, bad, args...), args[0]+":", "BULKHEAD_DRYRUN", "did you mean BULKHEAD_DRY_RUN?")
	}
	wantDemoOutput(t, runCmd(t, bad, "demo"))
	clitest.WantOneLineError(t, runCmd(t, map[string]string{"BULKHEAD_ADAPTIV": "true"}, "policy"), "policy:",
		`BULKHEAD_ADAPTIV="true"`, "did you mean BULKHEAD_ADAPTIVE?")
}

func TestPolicySettingsAreFlagThenEnvironmentThenDefault(t *testing.T) {
	vars := map[string]string{
		cli.EnvMaxConcurrent: "3", cli.EnvMaxQueue: "5", cli.EnvQueueWait: "7ms",
		cli.EnvDryRun: "true", cli.EnvWorkloads: "batch:2:1:5ms",
	}
	r := runOK(t, vars, "policy", "--max-queue", "1", "--dry-run=false")
	clitest.WantCells(t, r.Stdout,
		"max concurrent (B) 3 from BULKHEAD_MAX_CONCURRENT=3",
		"max queue (Q) 1 from --max-queue",
		"queue wait 7ms from BULKHEAD_QUEUE_WAIT=7ms",
		"dry run false from --dry-run",
		"workloads 1 from BULKHEAD_WORKLOADS=batch:2:1:5ms",
		" workload batch B=2 Q=1 wait=5ms",
		"connections per instance 3 B = 3: the operations running",
	)
	// load: B and the wait from the environment, Q from the flag.
	r = runCmd(t, vars, "load", "--count", "2", "--clients", "1", "--hold", "0s", "--progress", "0",
		"--max-queue", "1", "--dry-run=false", "--workloads", "")
	if r.Code != cli.ExitOK || !strings.Contains(r.Stdout, "B=3 Q=1 wait=7ms\n") {
		t.Fatalf("exit %d, stderr %q\n%s", r.Code, r.Stderr, r.Stdout)
	}
}

func TestABadVariableIsOverriddenByItsFlagAlone(t *testing.T) {
	for _, c := range []struct {
		env, value, flag, flagValue string
	}{
		{cli.EnvMaxConcurrent, "four", "--max-concurrent", "2"},
		{cli.EnvMaxQueue, "+4", "--max-queue", "0"},
		{cli.EnvQueueWait, "20", "--queue-wait", "20ms"},
		{cli.EnvDryRun, "yes", "--dry-run", "true"},
		{cli.EnvWorkloads, "batch:2", "--workloads", "batch:1:0:0s"},
		{cli.EnvWorkloads, "batch:1:0:0s:high", "--workloads", "batch:1:0:0s:-1"},
		{cli.EnvAdaptive, "yes", "--adaptive", "true"},
		{cli.EnvAdaptive, "", "--adaptive", "false"},
	} {
		t.Run(c.env, func(t *testing.T) {
			vars := map[string]string{c.env: c.value}
			r := runCmd(t, vars, "policy")
			clitest.WantOneLineError(t, r, "policy:", c.env, `"`+c.value+`"`, "want", c.flag+" overrides it")
			runQuiet(t, vars, "policy", c.flag+"="+c.flagValue)
		})
	}
	// The same in load: one flag overrides one bad variable.
	runOK(t, map[string]string{cli.EnvMaxConcurrent: "four"}, "load", "--count", "2", "--clients", "1",
		"--hold", "0s", "--progress", "0", "--max-concurrent", "1")
}

func TestAPolicyInvalidAsAWholeNamesWhereEachFieldCameFrom(t *testing.T) {
	r := runCmd(t, map[string]string{cli.EnvQueueWait: "0s"}, "policy", "--max-queue", "3")
	clitest.WantOneLineError(t, r, "policy:", "MaxQueue is 3 with QueueWait 0s", "Q=3 from --max-queue", "wait=0s from BULKHEAD_QUEUE_WAIT=0s", "B=10 default")
	r = runCmd(t, nil, "policy", "--max-concurrent", "2", "--workloads", "batch:3:0:0s")
	clitest.WantOneLineError(t, r, "policy:", `workload "batch"`, "MaxConcurrent is 3", "workloads from --workloads")
	r = runCmd(t, nil, "policy", "--workloads", "Batch:1:0:0s")
	clitest.WantOneLineError(t, r, "policy:", `--workloads="Batch:1:0:0s"`, `workload name "Batch"`)
	// A floor without adaptive, or above B.
	r = runCmd(t, map[string]string{cli.EnvMinConcurrent: "2"}, "policy")
	clitest.WantOneLineError(t, r, "policy:", "MinConcurrent is 2 without Adaptive", "min=2 from BULKHEAD_MIN_CONCURRENT=2", "adaptive=false default, BULKHEAD_ADAPTIVE unset")
	r = runCmd(t, map[string]string{cli.EnvAdaptive: "true", cli.EnvMinConcurrent: "2"}, "policy", "--adaptive=false")
	clitest.WantOneLineError(t, r, "policy:", "MinConcurrent is 2 without Adaptive", "adaptive=false from --adaptive")
	r = runCmd(t, map[string]string{cli.EnvAdaptive: "true"}, "policy", "--max-concurrent", "4", "--min-concurrent", "5")
	clitest.WantOneLineError(t, r, "policy:", "MinConcurrent is 5, want 0 to MaxConcurrent (4)", "B=4 from --max-concurrent",
		"adaptive=true from BULKHEAD_ADAPTIVE=true", "min=5 from --min-concurrent")
	// The same in load and budget, before they connect.
	r = runCmd(t, nil, "load", "--min-concurrent", "2")
	clitest.WantOneLineError(t, r, "load:", "MinConcurrent is 2 without Adaptive", "min=2 from --min-concurrent")
	r = runCmd(t, nil, "budget", "--dsn", "postgres://nobody@127.0.0.1:1/none", "--adaptive", "--max-concurrent", "2", "--min-concurrent", "3")
	clitest.WantOneLineError(t, r, "budget:", "MinConcurrent is 3, want 0 to MaxConcurrent (2)", "B=2 from --max-concurrent", "min=3 from --min-concurrent")
}

func TestFlagsThatDoNothingAreErrors(t *testing.T) {
	for _, c := range [][]string{
		{"load", "--max-open-conns", "4"},
		{"load", "--cpu-rows", "500"},
		{"load", "--work", "cpu", "--hold", "5ms"},
		{"load", "--workloads", "batch:1:0:0s"},
		{"budget", "--queue-wait", "5ms"},
		{"budget", "--workloads", "batch:1:0:0s"},
		{"budget", "--conns-per-instance", "3", "--max-concurrent", "2"},
		{"demo", "--max-concurrent", "2"},
		{"demo", "--dry-run"},
		{"demo", "--adaptive"},
		{"demo", "--min-concurrent", "2"},
		{"budget", "--conns-per-instance", "3", "--adaptive"},
		{"budget", "--conns-per-instance", "3", "--min-concurrent", "2"},
		{"policy", "--dsn", "postgres://h/db"},
	} {
		t.Run(strings.Join(c, " "), func(t *testing.T) {
			r := runCmd(t, nil, c...)
			clitest.WantOneLineError(t, r, c[0]+":", "does nothing")
		})
	}
	// Their variables are not read where they do nothing.
	r := runCmd(t, map[string]string{cli.EnvMaxConcurrent: "zero"}, "demo")
	wantDemoOutput(t, r)
}

func TestBadFlagValuesNameTheFlagTheValueAndWhatIsWanted(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"load", "--clients", "many"}, []string{`--clients "many": want an integer`}},
		{[]string{"load", "--deadline", "10"}, []string{`--deadline "10": want a Go duration with a unit`}},
		{[]string{"load", "--dry-run=maybe"}, []string{`--dry-run "maybe": want true or false`}},
		{[]string{"load", "--max-concurrent", "x"}, []string{`--max-concurrent "x": want a decimal integer`}},
		{[]string{"budget", "--queue-wait", "soon"}, []string{`--queue-wait "soon": want a Go duration`}},
		{[]string{"load", "--max-concurrent", "0"}, []string{"--max-concurrent is 0, want an integer from 1"}},
		{[]string{"load", "--max-open-conns", "-1", "--baseline"}, []string{"--max-open-conns is -1"}},
		{[]string{"load", "--chart", "load.png"}, []string{"--chart", "PNG is not supported"}},
		{[]string{"policy", "--fleet", "Orders"}, []string{"--fleet", `fleet name "Orders"`, "a-z, 0-9, _ and -"}},
		{[]string{"budget", "--instances", "x"}, []string{`--instances "x": want an integer`}},
		{[]string{"policy", "--queue-wait", "2h"}, []string{"--queue-wait is 2h0m0s, want 0s to 1h0m0s"}},
		{[]string{"load", "--workload", "batch"}, []string{`--workload "batch" names no workload`}},
		{[]string{"load", "--workloads", "a:1:0:0s", "--workload", "b"}, []string{`--workload "b" is not a workload of the policy; want one of a`}},
		{[]string{"load", "--adaptive=maybe"}, []string{`--adaptive "maybe": want true or false`}},
		{[]string{"policy", "--min-concurrent", "two"}, []string{`--min-concurrent "two": want a decimal integer`}},
		{[]string{"policy", "--min-concurrent", "0"}, []string{"--min-concurrent is 0, want an integer from 1 to 2147483647"}},
		{[]string{"budget", "--min-concurrent", "-1"}, []string{"--min-concurrent is -1, want an integer from 1"}},
		{[]string{"policy", "--workloads", "batch:1:0:0s:101"}, []string{`--workloads="batch:1:0:0s:101"`, `workload "batch" priority "101"`, "want an integer from -100 to 100"}},
		{[]string{"load", "--workloads", "batch:1:0:0s:+1"}, []string{`--workloads="batch:1:0:0s:+1"`, `priority "+1"`}},
		{[]string{"policy", "--workloads", "batch:1:0:0s:1:2"}, []string{`--workloads="batch:1:0:0s:1:2"`, `entry "batch:1:0:0s:1:2"`, "name:B:Q:wait[:priority]"}},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			clitest.WantOneLineError(t, runCmd(t, nil, c.args...), append([]string{c.args[0] + ":"}, c.want...)...)
		})
	}
}

func TestHelpShowsTheRealDefaults(t *testing.T) {
	h := runCmd(t, nil, "load", "--help").Stdout
	for _, want := range []string{"(default 10, or $BULKHEAD_MAX_CONCURRENT)", "(default 100ms, or $BULKHEAD_QUEUE_WAIT)",
		"(default none, or $BULKHEAD_WORKLOADS)", `(default "hold")`, "--dry-run\n", "--adaptive\n",
		"(default 1, or $BULKHEAD_MIN_CONCURRENT)", "name:B:Q:wait[:priority]",
		"  BULKHEAD_ADAPTIVE        --adaptive        true or false; default false",
		"  BULKHEAD_MIN_CONCURRENT  --min-concurrent  integer 1 to B, with adaptive only; default 1"} {
		if !strings.Contains(h, want) {
			t.Errorf("load --help lacks %q:\n%s", want, h)
		}
	}
	h = runCmd(t, nil, "budget", "--help").Stdout
	if !strings.Contains(h, "--queue-wait duration\n    \tlongest wait for a permit (default none: budget does not use it, an error)") {
		t.Errorf("budget --help does not say --queue-wait is unused:\n%s", h)
	}
}

func TestPolicyShowsDryRunAndWorkloads(t *testing.T) {
	r := runOK(t, map[string]string{cli.EnvDryRun: "true", cli.EnvWorkloads: "report:1:0:0s,batch:2:4:50ms:-1"}, "policy")
	clitest.WantCells(t, r.Stdout,
		"dry run true from BULKHEAD_DRY_RUN=true",
		"workloads 2 from BULKHEAD_WORKLOADS=report:1:0:0s,batch:2:4:50ms:-1",
		" workload batch B=2 Q=4 wait=50ms priority=-1 within the policy's B and B+Q, its priority in the policy's queue",
		" workload report B=1 Q=0 wait=0s priority=0 within",
		"connections per instance no bound in dry-run the gate runs every operation, each with its server connection: one per operation in flight",
	)
	if i, j := strings.Index(r.Stdout, "workload batch"), strings.Index(r.Stdout, "workload report"); i > j {
		t.Error("workloads not sorted by name")
	}
	r = runCmd(t, nil, "policy")
	clitest.WantCells(t, r.Stdout, "dry run false default, BULKHEAD_DRY_RUN unset", "workloads none default, BULKHEAD_WORKLOADS unset")
}

// Adaptive, as dry-run: flag > variable > default, and its floor shown
// with it (1 unless given; none without adaptive).
func TestPolicyShowsAdaptiveAndItsFloor(t *testing.T) {
	r := runQuiet(t, map[string]string{cli.EnvAdaptive: "true", cli.EnvMinConcurrent: "2"}, "policy", "--max-concurrent", "16")
	clitest.WantCells(t, r.Stdout,
		"adaptive true from BULKHEAD_ADAPTIVE=true: the B in force moves from 2 to B=16 by the hold times measured",
		"min concurrent 2 from BULKHEAD_MIN_CONCURRENT=2",
		"connections per instance 16 B = 16:", "adaptive: B=16 is the ceiling of the B in force",
	)
	// The flags override the variables, malformed ones too.
	r = runQuiet(t, map[string]string{cli.EnvAdaptive: "on", cli.EnvMinConcurrent: "+2"}, "policy", "--adaptive", "--min-concurrent", "3")
	clitest.WantCells(t, r.Stdout, "adaptive true from --adaptive: the B in force moves from 3 to B=10", "min concurrent 3 from --min-concurrent")
	r = runCmd(t, map[string]string{cli.EnvAdaptive: "true"}, "policy")
	clitest.WantCells(t, r.Stdout, "adaptive true from BULKHEAD_ADAPTIVE=true: the B in force moves from 1 to B=10",
		"min concurrent 1 default, BULKHEAD_MIN_CONCURRENT unset")
	r = runCmd(t, map[string]string{cli.EnvAdaptive: "true"}, "policy", "--adaptive=false")
	clitest.WantCells(t, r.Stdout, "adaptive false from --adaptive", "min concurrent none default, BULKHEAD_MIN_CONCURRENT unset: adaptive only")
	// A malformed variable names itself, its value, what it wants and
	// the flag that overrides it.
	for _, c := range []struct{ env, value, want string }{
		{cli.EnvAdaptive, "yes", "want true or false"},
		{cli.EnvAdaptive, "True", "want true or false"},
		{cli.EnvMinConcurrent, "0", "want a decimal integer from 1 to 2147483647"},
		{cli.EnvMinConcurrent, "+2", "want a decimal integer from 1"},
		{cli.EnvMinConcurrent, "1.5", "want a decimal integer from 1"},
	} {
		vars := map[string]string{cli.EnvAdaptive: "true", c.env: c.value}
		flag := "--adaptive"
		if c.env == cli.EnvMinConcurrent {
			flag = "--min-concurrent"
		}
		clitest.WantOneLineError(t, runCmd(t, vars, "policy"), "policy:", c.env+`="`+c.value+`"`, c.want, flag+" overrides it")
	}
	clitest.WantOneLineError(t, runCmd(t, map[string]string{cli.EnvAdaptive: "true", cli.EnvMinConcurrent: ""}, "policy"),
		"policy:", cli.EnvMinConcurrent+" is set but empty", "--min-concurrent overrides it")
	clitest.WantOneLineError(t, runCmd(t, map[string]string{cli.EnvAdaptive: ""}, "policy"), "policy:", cli.EnvAdaptive+`=""`, "want true or false")
}

// load takes adaptive from the environment, says so in its setup and its
// JSON, and runs its gate with it.
func TestLoadRunsAnAdaptiveGate(t *testing.T) {
	jsonPath := t.TempDir() + "/load.json"
	r := runOK(t, map[string]string{cli.EnvAdaptive: "true", cli.EnvWorkloads: "batch:2:4:10s:-1"}, "load", "--clients", "4", "--count", "40",
		"--max-concurrent", "3", "--min-concurrent", "2", "--max-queue", "4", "--queue-wait", "10s", "--hold", "1ms", "--deadline", "30s",
		"--progress", "0", "--workload", "batch", "--json", jsonPath)
	run := clitest.ReadJSON[loadReport](t, jsonPath).Runs[0]
	wantTotalsAddUp(t, run)
	if run.Policy == nil || *run.Policy != (cli.PolicyJSON{MaxConcurrent: 3, MaxQueue: 4, QueueWaitMs: 10000, Adaptive: true, MinConcurrent: 2}) {
		t.Errorf("policy %+v, want adaptive from 2 to 3", run.Policy)
	}
	if want := "B=3 Q=4 wait=10s workload batch B=2 Q=4 wait=10s priority=-1, adaptive from 2 to 3"; run.Setup != want || !strings.Contains(r.Stdout, want) {
		t.Errorf("setup %q, want %q; table:\n%s", run.Setup, want, r.Stdout)
	}
}

// An operation that can no longer make its deadline is refused
// (ErrWouldMissDeadline): counted apart from the other rejections, as
// the gate counts it, in the table, the JSON and the totals.
func TestLoadCountsTheRejectionsThatWouldMissTheirDeadline(t *testing.T) {
	jsonPath := t.TempDir() + "/load.json"
	r := runOK(t, nil, "load", "--clients", "8", "--count", "60", "--max-concurrent", "1", "--max-queue", "8", "--queue-wait", "1s",
		"--hold", "20ms", "--deadline", "30ms", "--backoff", "1ms", "--progress", "0", "--json", jsonPath)
	run := clitest.ReadJSON[loadReport](t, jsonPath).Runs[0]
	if err := run.checkTotals(); err != nil {
		t.Error(err)
	}
	if run.RejectedDeadline == 0 || run.Gate == nil || run.Gate.RejectedDeadline != run.RejectedDeadline ||
		run.Gate.RejectedFull != run.RejectedFull || run.Gate.RejectedTimeout != run.RejectedTimeout {
		t.Fatalf("rejected full %d, timeout %d, would miss deadline %d; gate %+v: want some that would miss, as the gate counted",
			run.RejectedFull, run.RejectedTimeout, run.RejectedDeadline, run.Gate)
	}
	sum := 0
	for _, s := range run.Seconds {
		sum += s.RejectedDeadline
	}
	if int64(sum) != run.RejectedDeadline {
		t.Errorf("per second %d would miss their deadline, in all %d", sum, run.RejectedDeadline)
	}
	clitest.WantCells(t, r.Stdout,
		fmt.Sprintf("rejected: would miss deadline %d", run.RejectedDeadline),
		fmt.Sprintf("gated: attempted 60 = completed %d + rejected %d +", run.Completed, run.RejectedFull+run.RejectedTimeout+run.RejectedDeadline),
	)
}

func TestLoadHonoursDryRun(t *testing.T) {
	jsonPath := t.TempDir() + "/load.json"
	r := runOK(t, map[string]string{cli.EnvDryRun: "true"}, "load", "--clients", "4", "--count", "40",
		"--max-concurrent", "1", "--max-queue", "0", "--queue-wait", "0s", "--hold", "1ms", "--deadline", "30s",
		"--progress", "0", "--json", jsonPath)
	run := clitest.ReadJSON[loadReport](t, jsonPath).Runs[0]
	wantTotalsAddUp(t, run)
	// Nothing is rejected: the gate counts what it would have rejected.
	if run.Completed != 40 || run.RejectedFull+run.RejectedTimeout != 0 {
		t.Errorf("completed %d, rejected %d; want 40 and 0 in dry-run", run.Completed, run.RejectedFull+run.RejectedTimeout)
	}
	if run.Gate == nil || !run.Gate.DryRun || run.Policy == nil || !run.Policy.DryRun {
		t.Errorf("gate %+v, policy %+v: not in dry-run", run.Gate, run.Policy)
	}
	clitest.WantText(t, r.Stdout, "B=1 Q=0 wait=0s dry-run", "dry run: would reject full", "dry run: would wait")
}

func TestLoadTagsItsOperationsWithTheWorkload(t *testing.T) {
	jsonPath := t.TempDir() + "/load.json"
	r := runOK(t, map[string]string{cli.EnvWorkloads: "batch:1:1:10s"}, "load", "--clients", "3", "--count", "12",
		"--max-concurrent", "2", "--max-queue", "2", "--queue-wait", "10s", "--hold", "1ms", "--deadline", "30s",
		"--progress", "0", "--workload", "batch", "--json", jsonPath)
	run := clitest.ReadJSON[loadReport](t, jsonPath).Runs[0]
	wantTotalsAddUp(t, run)
	if run.Workload != "batch" || !strings.Contains(r.Stdout, "workload batch B=1 Q=1 wait=10s") {
		t.Errorf("workload %q; table:\n%s", run.Workload, r.Stdout)
	}
	// Three clients, the workload's B+Q is 2: the third is rejected by
	// the workload's budget whenever the others hold both of its permits.
	if run.Completed+run.RejectedFull != 12 || run.RejectedTimeout != 0 {
		t.Errorf("completed %d, full %d, timeout %d", run.Completed, run.RejectedFull, run.RejectedTimeout)
	}
}

func TestBudgetInDryRunNeedsTheConnectionsGiven(t *testing.T) {
	r := runCmd(t, map[string]string{cli.EnvDryRun: "true"}, "budget", "--dsn", "postgres://h/db")
	clitest.WantOneLineError(t, r, "budget:", "dry run (from BULKHEAD_DRY_RUN=true)", "runs every operation", "--conns-per-instance", "--dry-run=false")
}

func TestVersionNamesTheBuild(t *testing.T) {
	r := runCmd(t, nil, "version")
	if r.Code != cli.ExitOK || !strings.HasPrefix(r.Stdout, "bulkhead ") || !strings.HasSuffix(r.Stdout, " "+runtime.Version()+"\n") {
		t.Fatalf("exit %d, stdout %q, stderr %q", r.Code, r.Stdout, r.Stderr)
	}
	if got := runCmd(t, nil, "--version"); got.Stdout != r.Stdout {
		t.Errorf("--version %q, version %q", got.Stdout, r.Stdout)
	}
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.modified", Value: "true"}, {Key: "vcs.time", Value: "2026-11-30T10:00:00Z"},
	}}
	if got, want := versionLine(bi, true), "bulkhead v1.2.3 revision 0123456789ab+modified (2026-11-30T10:00:00Z) go1.26.8"; got != want {
		t.Errorf("versionLine = %q, want %q", got, want)
	}
	if got, want := versionLine(&debug.BuildInfo{GoVersion: "go1.26.8"}, true), "bulkhead (devel) go1.26.8"; got != want {
		t.Errorf("versionLine = %q, want %q", got, want)
	}
	if got := versionLine(nil, false); !strings.Contains(got, "no build information") {
		t.Errorf("versionLine without build info = %q", got)
	}
}
