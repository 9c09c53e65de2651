//go:build go1.25

package bulkhead

// BULKHEAD_WORKLOADS and BULKHEAD_DRY_RUN, and Policy.Validate of
// workloads. polCheckMessage and polEnviron come from policy_test.go.

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead/internal/fakedb"
)

func TestWorkloadsAndDryRunFromTheEnvironmentParseValidValues(t *testing.T) {
	name64 := strings.Repeat("a", 64)
	withBase := DefaultPolicy
	withBase.DryRun = true
	withBase.Workloads = map[string]Workload{"old": {MaxConcurrent: 1}}
	for _, c := range []struct {
		name string
		base Policy
		env  map[string]string
		want Policy
	}{
		{"two workloads", DefaultPolicy, map[string]string{envWorkloads: "batch:2:4:50ms,report:1:0:0s"},
			Policy{MaxConcurrent: 10, MaxQueue: 10, QueueWait: 100 * time.Millisecond, Workloads: map[string]Workload{
				"batch": {MaxConcurrent: 2, MaxQueue: 4, QueueWait: 50 * time.Millisecond}, "report": {MaxConcurrent: 1}}}},
		{"names of digits, _ and -, 64 long", DefaultPolicy, map[string]string{envWorkloads: "a-1_b:1:0:1h," + name64 + ":10:10:1s"},
			Policy{MaxConcurrent: 10, MaxQueue: 10, QueueWait: 100 * time.Millisecond, Workloads: map[string]Workload{
				"a-1_b": {MaxConcurrent: 1, QueueWait: time.Hour}, name64: {MaxConcurrent: 10, MaxQueue: 10, QueueWait: time.Second}}}},
		{"a workload checked against B from the environment", DefaultPolicy,
			map[string]string{envWorkloads: "big:15:0:0s", envB: "20"},
			Policy{MaxConcurrent: 20, MaxQueue: 10, QueueWait: 100 * time.Millisecond, Workloads: map[string]Workload{"big": {MaxConcurrent: 15}}}},
		{"empty: no workloads", withBase, map[string]string{envWorkloads: ""},
			Policy{MaxConcurrent: 10, MaxQueue: 10, QueueWait: 100 * time.Millisecond, DryRun: true, Workloads: map[string]Workload{}}},
		{"unset: the base's", withBase, map[string]string{}, withBase},
		{"dry-run true", DefaultPolicy, map[string]string{envDryRun: "true"},
			Policy{MaxConcurrent: 10, MaxQueue: 10, QueueWait: 100 * time.Millisecond, DryRun: true}},
		{"dry-run false over a base's true", withBase, map[string]string{envDryRun: "false"},
			Policy{MaxConcurrent: 10, MaxQueue: 10, QueueWait: 100 * time.Millisecond, Workloads: withBase.Workloads}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := PolicyFromEnviron(c.base, polEnviron(c.env))
			if err != nil {
				t.Fatal(err)
			}
			if !samePolicy(got, c.want) {
				t.Fatalf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestMalformedWorkloadsAndDryRunValuesAreErrorsNamingTheVariableAndTheValue(t *testing.T) {
	const wantEntry = "want name:B:Q:wait[:priority] entries separated by commas"
	const wantName = "want 1 to 64 of a-z, 0-9, _ and -"
	for _, c := range []struct {
		env  string
		v    string
		want []string // besides "bulkhead: ", ErrInvalidPolicy and one line
	}{
		// Entries.
		{envWorkloads, "batch", []string{`BULKHEAD_WORKLOADS="batch"`, `entry "batch"`, wantEntry}},
		{envWorkloads, "batch:2:4", []string{`BULKHEAD_WORKLOADS="batch:2:4"`, wantEntry}},
		{envWorkloads, "batch:2:4:50ms:1:2", []string{`BULKHEAD_WORKLOADS="batch:2:4:50ms:1:2"`, wantEntry}},
		// Priorities.
		{envWorkloads, "batch:2:4:50ms:101", []string{`BULKHEAD_WORKLOADS="batch:2:4:50ms:101"`, `workload "batch" priority "101"`, "want an integer from -100 to 100"}},
		{envWorkloads, "batch:2:4:50ms:+1", []string{`priority "+1"`, "want an integer from -100 to 100"}},
		{envWorkloads, "batch:2:4:50ms:", []string{`priority ""`}},
		{envWorkloads, "batch:2:4:50ms:high", []string{`priority "high"`}},
		{envWorkloads, "batch:2:4:50ms,", []string{`BULKHEAD_WORKLOADS="batch:2:4:50ms,"`, `entry ""`, wantEntry}},
		{envWorkloads, ",batch:2:4:50ms", []string{`BULKHEAD_WORKLOADS=",batch:2:4:50ms"`, `entry ""`}},
		{envWorkloads, "batch:2:4:50ms;report:1:0:0s", []string{`BULKHEAD_WORKLOADS="batch:2:4:50ms;report:1:0:0s"`, wantEntry}},
		{envWorkloads, "batch:2:4:50ms\nreport:1:0:0s", []string{`BULKHEAD_WORKLOADS="batch:2:4:50ms\nreport:1:0:0s"`}},
		// Names.
		{envWorkloads, "Batch:2:4:50ms", []string{`BULKHEAD_WORKLOADS="Batch:2:4:50ms"`, `workload name "Batch"`, wantName}},
		{envWorkloads, " batch:2:4:50ms", []string{`BULKHEAD_WORKLOADS=" batch:2:4:50ms"`, `workload name " batch"`}},
		{envWorkloads, ":2:4:50ms", []string{`BULKHEAD_WORKLOADS=":2:4:50ms"`, `workload name ""`}},
		{envWorkloads, "b\u00e4tch:2:4:50ms", []string{"BULKHEAD_WORKLOADS=\"b\u00e4tch:2:4:50ms\"", wantName}},
		{envWorkloads, strings.Repeat("a", 65) + ":1:0:0s", []string{`BULKHEAD_WORKLOADS="` + strings.Repeat("a", 65), wantName}},
		{envWorkloads, "batch:1:0:0s,report:1:0:0s,batch:2:0:0s", []string{`BULKHEAD_WORKLOADS="batch:1:0:0s,report:1:0:0s,batch:2:0:0s"`, `workload "batch" appears twice`}},
		// B.
		{envWorkloads, "batch:0:4:50ms", []string{"BULKHEAD_WORKLOADS batch B", `"0"`, "want a decimal integer from 1"}},
		{envWorkloads, "batch:+2:4:50ms", []string{"BULKHEAD_WORKLOADS batch B", `"+2"`}},
		{envWorkloads, "batch:-1:4:50ms", []string{"BULKHEAD_WORKLOADS batch B", `"-1"`}},
		{envWorkloads, "batch: 2:4:50ms", []string{"BULKHEAD_WORKLOADS batch B", `" 2"`}},
		{envWorkloads, "batch:2.0:4:50ms", []string{"BULKHEAD_WORKLOADS batch B", `"2.0"`}},
		{envWorkloads, "batch:0x2:4:50ms", []string{"BULKHEAD_WORKLOADS batch B", `"0x2"`}},
		{envWorkloads, "batch:99999999999:4:50ms", []string{"BULKHEAD_WORKLOADS batch B", `"99999999999"`}},
		{envWorkloads, "batch::4:50ms", []string{"BULKHEAD_WORKLOADS batch B", "empty"}},
		// Q.
		{envWorkloads, "batch:2:-1:50ms", []string{"BULKHEAD_WORKLOADS batch Q", `"-1"`, "want a decimal integer from 0"}},
		{envWorkloads, "batch:2:1e3:50ms", []string{"BULKHEAD_WORKLOADS batch Q", `"1e3"`}},
		{envWorkloads, "batch:2::50ms", []string{"BULKHEAD_WORKLOADS batch Q", "empty"}},
		// Wait.
		{envWorkloads, "batch:2:4:50", []string{"BULKHEAD_WORKLOADS batch wait", `"50"`, "want a Go duration with a unit"}},
		{envWorkloads, "batch:2:4:-1ms", []string{"BULKHEAD_WORKLOADS batch wait", `"-1ms"`}},
		{envWorkloads, "batch:2:4:-0s", []string{"BULKHEAD_WORKLOADS batch wait", `"-0s"`}},
		{envWorkloads, "batch:2:4:+1s", []string{"BULKHEAD_WORKLOADS batch wait", `"+1s"`}},
		{envWorkloads, "batch:2:4:2h", []string{"BULKHEAD_WORKLOADS batch wait", `"2h"`, "to 1h0m0s"}},
		{envWorkloads, "batch:2:4:50ms ", []string{"BULKHEAD_WORKLOADS batch wait", `"50ms "`}},
		{envWorkloads, "batch:2:4:", []string{"BULKHEAD_WORKLOADS batch wait", "empty"}},
		// Dry-run: true or false, nothing else.
		{envDryRun, "", []string{`BULKHEAD_DRY_RUN=""`, "want true or false"}},
		{envDryRun, "1", []string{`BULKHEAD_DRY_RUN="1"`, "want true or false"}},
		{envDryRun, "0", []string{`BULKHEAD_DRY_RUN="0"`}},
		{envDryRun, "TRUE", []string{`BULKHEAD_DRY_RUN="TRUE"`}},
		{envDryRun, "True", []string{`BULKHEAD_DRY_RUN="True"`}},
		{envDryRun, "t", []string{`BULKHEAD_DRY_RUN="t"`}},
		{envDryRun, "yes", []string{`BULKHEAD_DRY_RUN="yes"`}},
		{envDryRun, " true", []string{`BULKHEAD_DRY_RUN=" true"`}},
		{envDryRun, "true\n", []string{`BULKHEAD_DRY_RUN="true\n"`}},
	} {
		t.Run(c.env+"="+strconv.Quote(c.v), func(t *testing.T) {
			polRejects(t, DefaultPolicy, polEnviron(map[string]string{c.env: c.v}), c.want...)
		})
	}
}

// The error names the variables, the workload, its field, value and limit.
func TestWorkloadsFromTheEnvironmentThatDoNotFitThePolicyNameTheVariable(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want []string
	}{
		{map[string]string{envWorkloads: "batch:11:0:0s"}, []string{`BULKHEAD_WORKLOADS="batch:11:0:0s"`, `workload "batch": MaxConcurrent is 11, want 1 to the policy's 10`}},
		{map[string]string{envWorkloads: "batch:10:11:0s"}, []string{`BULKHEAD_WORKLOADS="batch:10:11:0s"`, `workload "batch": MaxQueue is 11, want 0 to 10 (its B+Q within the policy's 20)`}},
		{map[string]string{envWorkloads: "batch:2:0:0s", envB: "1"}, []string{`BULKHEAD_WORKLOADS="batch:2:0:0s"`, `MaxConcurrent is 2, want 1 to the policy's 1`, `BULKHEAD_MAX_CONCURRENT="1"`}},
	} {
		polRejects(t, DefaultPolicy, polEnviron(c.env), c.want...)
	}
}

func TestValidateNamesTheInvalidWorkloadItsFieldAndItsValue(t *testing.T) {
	base := Policy{MaxConcurrent: 4, MaxQueue: 2, QueueWait: time.Second}
	with := func(ws map[string]Workload) Policy {
		p := base
		p.Workloads = ws
		return p
	}
	for _, c := range []struct {
		name string
		ws   map[string]Workload
		want []string
	}{
		{"empty name", map[string]Workload{"": {MaxConcurrent: 1}}, []string{`workload name ""`, "want 1 to 64 of a-z, 0-9, _ and -"}},
		{"upper case", map[string]Workload{"Batch": {MaxConcurrent: 1}}, []string{`workload name "Batch"`}},
		{"space", map[string]Workload{"a b": {MaxConcurrent: 1}}, []string{`workload name "a b"`}},
		{"colon", map[string]Workload{"a:b": {MaxConcurrent: 1}}, []string{`workload name "a:b"`}},
		{"newline", map[string]Workload{"a\nb": {MaxConcurrent: 1}}, []string{`workload name "a\nb"`}},
		{"65 long", map[string]Workload{strings.Repeat("x", 65): {MaxConcurrent: 1}}, []string{`workload name "` + strings.Repeat("x", 65) + `"`}},
		{"B 0", map[string]Workload{"batch": {}}, []string{`workload "batch": MaxConcurrent is 0, want 1 to the policy's 4`}},
		{"B negative", map[string]Workload{"batch": {MaxConcurrent: math.MinInt}}, []string{`MaxConcurrent is ` + strconv.Itoa(math.MinInt)}},
		{"B above the policy's", map[string]Workload{"batch": {MaxConcurrent: 5}}, []string{`workload "batch": MaxConcurrent is 5, want 1 to the policy's 4`}},
		{"Q negative", map[string]Workload{"batch": {MaxConcurrent: 1, MaxQueue: -1}}, []string{`workload "batch": MaxQueue is -1, want 0 to 5 (its B+Q within the policy's 6)`}},
		{"B+Q above the policy's", map[string]Workload{"batch": {MaxConcurrent: 4, MaxQueue: 3}}, []string{`MaxQueue is 3, want 0 to 2`}},
		{"Q at the int maximum", map[string]Workload{"batch": {MaxConcurrent: 1, MaxQueue: math.MaxInt}}, []string{`MaxQueue is ` + strconv.Itoa(math.MaxInt)}},
		{"wait negative", map[string]Workload{"batch": {MaxConcurrent: 1, QueueWait: -time.Nanosecond}}, []string{`workload "batch": QueueWait is -1ns, want 0s to 1h0m0s`}},
		{"wait above the maximum", map[string]Workload{"batch": {MaxConcurrent: 1, QueueWait: MaxQueueWait + 1}}, []string{`QueueWait is 1h0m0.000000001s`}},
		{"the first invalid by name", map[string]Workload{"zz": {}, "aa": {MaxConcurrent: 1, MaxQueue: -2}, "mm": {MaxConcurrent: 9}}, []string{`workload "aa": MaxQueue is -2`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := with(c.ws).Validate()
			if err == nil {
				t.Fatal("Validate accepted it")
			}
			polCheckMessage(t, err, c.want...)
			if _, nerr := New(fakedb.New(), with(c.ws)); nerr == nil || nerr.Error() != err.Error() {
				t.Fatalf("New: %v, want Validate's error %v", nerr, err)
			}
		})
	}
	// The largest valid workload: the policy's B, and its B+Q.
	ok := with(map[string]Workload{"max": {MaxConcurrent: 4, MaxQueue: 2, QueueWait: MaxQueueWait}, "min": {MaxConcurrent: 1}})
	if err := ok.Validate(); err != nil {
		t.Fatalf("the largest valid workloads: %v", err)
	}
	// The policy's own fields are checked before its workloads.
	bad := Policy{MaxConcurrent: 0, Workloads: map[string]Workload{"Bad": {}}}
	polCheckMessage(t, bad.Validate(), "MaxConcurrent is 0")
}
