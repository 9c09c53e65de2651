package main

import (
	"testing"

	"github.com/dbbulkhead/bulkhead"
)

func TestPolicyPrintsTheDefaultsWhenNothingIsSet(t *testing.T) {
	r := runCmd(t, nil, "policy")
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	wantCells(t, r.stdout,
		"max concurrent (B) 10 default, BULKHEAD_MAX_CONCURRENT unset",
		"max queue (Q) 10 default, BULKHEAD_MAX_QUEUE unset",
		"queue wait 100ms default, BULKHEAD_QUEUE_WAIT unset",
		"dry run false default, BULKHEAD_DRY_RUN unset",
		"workloads none default, BULKHEAD_WORKLOADS unset",
		"connections per instance 20 at most B+Q",
	)
}

func TestPolicyPrintsWhatTheEnvironmentSets(t *testing.T) {
	vars := map[string]string{bulkhead.EnvMaxConcurrent: "4", bulkhead.EnvQueueWait: "20ms"}
	r := runCmd(t, vars, "policy")
	if r.code != exitOK {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	wantCells(t, r.stdout,
		"4 from BULKHEAD_MAX_CONCURRENT=4",
		"10 default, BULKHEAD_MAX_QUEUE unset",
		"20ms from BULKHEAD_QUEUE_WAIT=20ms",
		"connections per instance 14",
	)
}

func TestPolicyReportsTheLibraryErrorNamingTheVariable(t *testing.T) {
	cases := map[string]map[string]string{
		bulkhead.EnvMaxConcurrent: {bulkhead.EnvMaxConcurrent: "0"},
		bulkhead.EnvMaxQueue:      {bulkhead.EnvMaxQueue: "+4"},
		bulkhead.EnvQueueWait:     {bulkhead.EnvQueueWait: "1e9"},
	}
	for name, vars := range cases {
		t.Run(name, func(t *testing.T) {
			r := runCmd(t, vars, "policy")
			wantOneLineError(t, r, "policy:", name, `"`+vars[name]+`"`, "want")
			if r.stdout != "" {
				t.Errorf("stdout %q, want nothing", r.stdout)
			}
		})
	}
}
