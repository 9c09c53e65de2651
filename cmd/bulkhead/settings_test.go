package main

import (
	"encoding/json"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/dbbulkhead/bulkhead"
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
		names = append(names, m[1])
	}
	slices.Sort(names)
	names = slices.Compact(names)
	if len(names) < 5 {
		t.Fatalf("found only %v in policy.go", names)
	}
	return names
}

// squash reduces runs of spaces to one: tables are compared by their
// cells, not their padding.
func squash(s string) string { return regexp.MustCompile(` +`).ReplaceAllString(s, " ") }

// wantCells checks that out contains every want, padding aside.
func wantCells(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(squash(out), squash(w)) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

func TestTheToolKnowsEveryVariableTheLibraryReads(t *testing.T) {
	lib := libraryEnv(t)
	known := slices.Sorted(slices.Values(knownEnv()))
	if !slices.Equal(known, lib) {
		t.Fatalf("the tool knows %v, the library reads %v", known, lib)
	}
	help := runCmd(t, nil, "--help").stdout
	for _, name := range lib {
		if !strings.Contains(help, name) {
			t.Errorf("the top-level help does not list %s", name)
		}
	}
	// Each command's help lists the variables it reads, and only those.
	for cmd, unused := range unusedSettings {
		h := runCmd(t, nil, cmd, "--help").stdout
		for _, s := range settings {
			_, no := unused[s.flag]
			if listed := strings.Contains(h, "  "+s.env+" "); listed == no {
				t.Errorf("%s --help lists %s: %v; the command uses it: %v", cmd, s.env, listed, !no)
			}
		}
	}
}

func TestUnknownBulkheadVariableIsNamedWithTheKnownOnes(t *testing.T) {
	vars := map[string]string{"BULKHEAD_MAX_QUEU": "3", "BULKHEAD_TEST_DATABASE_URL": "postgres://x", "OTHER": "1"}
	r := runCmd(t, vars, "policy")
	if r.code != exitOK {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	line := strings.TrimSuffix(r.stderr, "\n")
	if strings.Contains(line, "\n") || !strings.HasPrefix(line, "bulkhead: warning: ") {
		t.Fatalf("want one warning line, got %q", r.stderr)
	}
	for _, want := range append([]string{"BULKHEAD_MAX_QUEU ", "did you mean BULKHEAD_MAX_QUEUE?"}, knownEnv()...) {
		if !strings.Contains(line, want) {
			t.Errorf("warning %q lacks %q", line, want)
		}
	}
	if strings.Contains(line, "BULKHEAD_TEST_") {
		t.Errorf("warned about the test suites' variable: %q", line)
	}
	// The misspelt Q is not read: Q stays the default.
	wantCells(t, r.stdout, "max queue (Q) 10 default, BULKHEAD_MAX_QUEUE unset")
	// Every command warns the same way.
	for _, args := range [][]string{{"demo"}, {"load", "--clients", "1", "--count", "1", "--hold", "0s", "--progress", "0"}} {
		r := runCmd(t, map[string]string{"BULKHEAD_DRYRUN": "true"}, args...)
		if r.code != exitOK || !strings.Contains(r.stderr, "unknown environment variable BULKHEAD_DRYRUN ignored (did you mean BULKHEAD_DRY_RUN?)") {
			t.Errorf("%s: exit %d, stderr %q", args[0], r.code, r.stderr)
		}
	}
}

func TestPolicySettingsAreFlagThenEnvironmentThenDefault(t *testing.T) {
	vars := map[string]string{
		bulkhead.EnvMaxConcurrent: "3", bulkhead.EnvMaxQueue: "5", bulkhead.EnvQueueWait: "7ms",
		bulkhead.EnvDryRun: "true", bulkhead.EnvWorkloads: "batch:2:1:5ms",
	}
	r := runCmd(t, vars, "policy", "--max-queue", "1", "--dry-run=false")
	if r.code != exitOK {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	wantCells(t, r.stdout,
		"max concurrent (B) 3 from BULKHEAD_MAX_CONCURRENT=3",
		"max queue (Q) 1 from --max-queue",
		"queue wait 7ms from BULKHEAD_QUEUE_WAIT=7ms",
		"dry run false from --dry-run",
		"workloads 1 from BULKHEAD_WORKLOADS=batch:2:1:5ms",
		" workload batch B=2 Q=1 wait=5ms",
		"connections per instance 4 at most B+Q",
	)
	// load: B and the wait from the environment, Q from the flag.
	r = runCmd(t, vars, "load", "--count", "2", "--clients", "1", "--hold", "0s", "--progress", "0",
		"--max-queue", "1", "--dry-run=false", "--workloads", "")
	if r.code != exitOK || !strings.Contains(r.stdout, "B=3 Q=1 wait=7ms\n") {
		t.Fatalf("exit %d, stderr %q\n%s", r.code, r.stderr, r.stdout)
	}
	// overload: the same variables, the same order.
	r = runCmd(t, map[string]string{bulkhead.EnvMaxConcurrent: "1", bulkhead.EnvMaxQueue: "4", bulkhead.EnvQueueWait: "3s"},
		"overload", "--capacity", "50", "--loads", "1", "--duration", "100ms", "--warmup", "0s",
		"--capacity-duration", "150ms", "--cpu-rows", "100", "--deadline", "10s", "--configs", "gate",
		"--max-queue", "2", "--json", "-")
	if r.code != exitOK {
		t.Fatalf("overload: exit %d, stderr %q", r.code, r.stderr)
	}
	var rep overloadReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Rule || rep.Policy != (policyJSON{MaxConcurrent: 1, MaxQueue: 2, QueueWaitMs: 3000}) {
		t.Errorf("overload policy %+v (by rule %v), want B=1 from the environment, Q=2 from the flag, wait 3s from the environment", rep.Policy, rep.Rule)
	}
}

func TestABadVariableIsOverriddenByItsFlagAlone(t *testing.T) {
	for _, c := range []struct {
		env, value, flag, flagValue string
	}{
		{bulkhead.EnvMaxConcurrent, "four", "--max-concurrent", "2"},
		{bulkhead.EnvMaxQueue, "+4", "--max-queue", "0"},
		{bulkhead.EnvQueueWait, "20", "--queue-wait", "20ms"},
		{bulkhead.EnvDryRun, "yes", "--dry-run", "true"},
		{bulkhead.EnvWorkloads, "batch:2", "--workloads", "batch:1:0:0s"},
	} {
		t.Run(c.env, func(t *testing.T) {
			vars := map[string]string{c.env: c.value}
			r := runCmd(t, vars, "policy")
			wantOneLineError(t, r, "policy:", c.env, `"`+c.value+`"`, "want", c.flag+" overrides it")
			r = runCmd(t, vars, "policy", c.flag+"="+c.flagValue)
			if r.code != exitOK || r.stderr != "" {
				t.Errorf("with %s=%s: exit %d, stderr %q", c.flag, c.flagValue, r.code, r.stderr)
			}
		})
	}
	// The same in load: one flag overrides one bad variable.
	r := runCmd(t, map[string]string{bulkhead.EnvMaxConcurrent: "four"}, "load", "--count", "2", "--clients", "1",
		"--hold", "0s", "--progress", "0", "--max-concurrent", "1")
	if r.code != exitOK {
		t.Fatalf("load: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestAPolicyInvalidAsAWholeNamesWhereEachFieldCameFrom(t *testing.T) {
	r := runCmd(t, map[string]string{bulkhead.EnvQueueWait: "0s"}, "policy", "--max-queue", "3")
	wantOneLineError(t, r, "policy:", "MaxQueue is 3 with QueueWait 0s", "Q=3 from --max-queue", "wait=0s from BULKHEAD_QUEUE_WAIT=0s", "B=10 default")
	r = runCmd(t, nil, "policy", "--max-concurrent", "2", "--workloads", "batch:3:0:0s")
	wantOneLineError(t, r, "policy:", `workload "batch"`, "MaxConcurrent is 3", "workloads from --workloads")
	r = runCmd(t, nil, "policy", "--workloads", "Batch:1:0:0s")
	wantOneLineError(t, r, "policy:", `--workloads="Batch:1:0:0s"`, `workload name "Batch"`)
}

func TestFlagsThatDoNothingAreErrors(t *testing.T) {
	for _, c := range [][]string{
		{"load", "--max-open-conns", "4"},
		{"load", "--cpu-rows", "500"},
		{"load", "--work", "cpu", "--hold", "5ms"},
		{"load", "--workloads", "batch:1:0:0s"},
		{"overload", "--configs", "plain,semaphore", "--queue-wait", "5ms"},
		{"overload", "--configs", "plain", "--dry-run"},
		{"overload", "--capacity", "100", "--capacity-workers", "2"},
		{"budget", "--queue-wait", "5ms"},
		{"budget", "--workloads", "batch:1:0:0s"},
		{"budget", "--conns-per-instance", "3", "--max-concurrent", "2"},
		{"demo", "--max-concurrent", "2"},
		{"demo", "--dry-run"},
		{"policy", "--dsn", "postgres://h/db"},
	} {
		t.Run(strings.Join(c, " "), func(t *testing.T) {
			r := runCmd(t, nil, c...)
			wantOneLineError(t, r, c[0]+":", "does nothing")
		})
	}
	// Their variables are not read where they do nothing.
	r := runCmd(t, map[string]string{bulkhead.EnvMaxConcurrent: "zero"}, "demo")
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
		{[]string{"overload", "--capacity", "fast"}, []string{`--capacity "fast": want a number`}},
		{[]string{"overload", "--seed", "-1"}, []string{`--seed "-1": want a non-negative integer`}},
		{[]string{"budget", "--queue-wait", "soon"}, []string{`--queue-wait "soon": want a Go duration`}},
		{[]string{"overload", "--max-concurrent", "0"}, []string{"--max-concurrent is 0, want an integer from 1"}},
		{[]string{"policy", "--queue-wait", "2h"}, []string{"--queue-wait is 2h0m0s, want 0s to 1h0m0s"}},
		{[]string{"load", "--workload", "batch"}, []string{`--workload "batch" names no workload`}},
		{[]string{"load", "--workloads", "a:1:0:0s", "--workload", "b"}, []string{`--workload "b" is not a workload of the policy; want one of a`}},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			wantOneLineError(t, runCmd(t, nil, c.args...), append([]string{c.args[0] + ":"}, c.want...)...)
		})
	}
}

func TestHelpShowsTheRealDefaults(t *testing.T) {
	h := runCmd(t, nil, "overload", "--help").stdout
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
	h = runCmd(t, nil, "load", "--help").stdout
	for _, want := range []string{"(default 10, or $BULKHEAD_MAX_CONCURRENT)", "(default 100ms, or $BULKHEAD_QUEUE_WAIT)",
		"(default none, or $BULKHEAD_WORKLOADS)", `(default "hold")`, "--dry-run\n"} {
		if !strings.Contains(h, want) {
			t.Errorf("load --help lacks %q:\n%s", want, h)
		}
	}
	h = runCmd(t, nil, "budget", "--help").stdout
	if !strings.Contains(h, "--queue-wait duration\n    \tlongest wait for a permit (default none: budget does not use it, an error)") {
		t.Errorf("budget --help does not say --queue-wait is unused:\n%s", h)
	}
}

func TestPolicyShowsDryRunAndWorkloads(t *testing.T) {
	r := runCmd(t, map[string]string{bulkhead.EnvDryRun: "true", bulkhead.EnvWorkloads: "report:1:0:0s,batch:2:4:50ms"}, "policy")
	if r.code != exitOK {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	wantCells(t, r.stdout,
		"dry run true from BULKHEAD_DRY_RUN=true",
		"workloads 2 from BULKHEAD_WORKLOADS=report:1:0:0s,batch:2:4:50ms",
		" workload batch B=2 Q=4 wait=50ms",
		" workload report B=1 Q=0 wait=0s",
		"in dry-run the gate dials beyond it",
	)
	if i, j := strings.Index(r.stdout, "workload batch"), strings.Index(r.stdout, "workload report"); i > j {
		t.Error("workloads not sorted by name")
	}
	r = runCmd(t, nil, "policy")
	wantCells(t, r.stdout, "dry run false default, BULKHEAD_DRY_RUN unset", "workloads none default, BULKHEAD_WORKLOADS unset")
}

func TestLoadHonoursDryRun(t *testing.T) {
	jsonPath := t.TempDir() + "/load.json"
	r := runCmd(t, map[string]string{bulkhead.EnvDryRun: "true"}, "load", "--clients", "4", "--count", "40",
		"--max-concurrent", "1", "--max-queue", "0", "--queue-wait", "0s", "--hold", "1ms", "--deadline", "30s",
		"--progress", "0", "--json", jsonPath)
	if r.code != exitOK {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	run := readReport(t, jsonPath).Runs[0]
	wantTotalsAddUp(t, run)
	// Nothing is rejected: the gate counts what it would have rejected.
	if run.Completed != 40 || run.RejectedFull+run.RejectedTimeout != 0 {
		t.Errorf("completed %d, rejected %d; want 40 and 0 in dry-run", run.Completed, run.RejectedFull+run.RejectedTimeout)
	}
	if run.Gate == nil || !run.Gate.DryRun || run.Policy == nil || !run.Policy.DryRun {
		t.Errorf("gate %+v, policy %+v: not in dry-run", run.Gate, run.Policy)
	}
	for _, want := range []string{"B=1 Q=0 wait=0s dry-run", "dry run: would reject full", "dry run: would wait"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestLoadTagsItsOperationsWithTheWorkload(t *testing.T) {
	jsonPath := t.TempDir() + "/load.json"
	r := runCmd(t, map[string]string{bulkhead.EnvWorkloads: "batch:1:1:10s"}, "load", "--clients", "3", "--count", "12",
		"--max-concurrent", "2", "--max-queue", "2", "--queue-wait", "10s", "--hold", "1ms", "--deadline", "30s",
		"--progress", "0", "--workload", "batch", "--json", jsonPath)
	if r.code != exitOK {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	run := readReport(t, jsonPath).Runs[0]
	wantTotalsAddUp(t, run)
	if run.Workload != "batch" || !strings.Contains(r.stdout, "workload batch B=1 Q=1 wait=10s") {
		t.Errorf("workload %q; table:\n%s", run.Workload, r.stdout)
	}
	// Three clients, the workload's B+Q is 2: the third is rejected by
	// the workload's budget whenever the others hold both of its permits.
	if run.Completed+run.RejectedFull != 12 || run.RejectedTimeout != 0 {
		t.Errorf("completed %d, full %d, timeout %d", run.Completed, run.RejectedFull, run.RejectedTimeout)
	}
}

func TestBudgetInDryRunNeedsTheConnectionsGiven(t *testing.T) {
	r := runCmd(t, map[string]string{bulkhead.EnvDryRun: "true"}, "budget", "--dsn", "postgres://h/db")
	wantOneLineError(t, r, "budget:", "dry run (from BULKHEAD_DRY_RUN=true)", "dials beyond B+Q", "--conns-per-instance", "--dry-run=false")
}

func TestVersionNamesTheBuild(t *testing.T) {
	r := runCmd(t, nil, "version")
	if r.code != exitOK || !strings.HasPrefix(r.stdout, "bulkhead ") || !strings.HasSuffix(r.stdout, " "+runtime.Version()+"\n") {
		t.Fatalf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if got := runCmd(t, nil, "--version"); got.stdout != r.stdout {
		t.Errorf("--version %q, version %q", got.stdout, r.stdout)
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

func TestEditDistanceFindsTheMisspelling(t *testing.T) {
	known := knownEnv()
	for in, want := range map[string]string{
		"BULKHEAD_MAX_QUEU":       bulkhead.EnvMaxQueue,
		"BULKHEAD_MAXCONCURRENT":  bulkhead.EnvMaxConcurrent,
		"BULKHEAD_QUEUEWAIT":      bulkhead.EnvQueueWait,
		"BULKHEAD_WORKLOAD":       bulkhead.EnvWorkloads,
		"BULKHEAD_SOMETHING_ELSE": "",
	} {
		if got := nearest(in, known); got != want {
			t.Errorf("nearest(%s) = %q, want %q", in, got, want)
		}
	}
}
