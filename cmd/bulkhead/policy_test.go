package main

import (
	"testing"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli/clitest"
)

func TestPolicyPrintsTheDefaultsWhenNothingIsSet(t *testing.T) {
	r := runCmd(t, nil, "policy")
	if r.Code != cli.ExitOK || r.Stderr != "" {
		t.Fatalf("exit %d, stderr %q", r.Code, r.Stderr)
	}
	clitest.WantCells(t, r.Stdout,
		"max concurrent (B) 10 default, BULKHEAD_MAX_CONCURRENT unset",
		"max queue (Q) 10 default, BULKHEAD_MAX_QUEUE unset",
		"queue wait 100ms default, BULKHEAD_QUEUE_WAIT unset",
		"dry run false default, BULKHEAD_DRY_RUN unset",
		"workloads none default, BULKHEAD_WORKLOADS unset",
		"adaptive false default, BULKHEAD_ADAPTIVE unset",
		"min concurrent none default, BULKHEAD_MIN_CONCURRENT unset: adaptive only",
		"connections per instance 30 at most B + (B+Q) = 10 + 20: B operations running, B+Q idle, as gate.OpenDB sets SetMaxIdleConns(B+Q)",
	)
}

func TestPolicyPrintsWhatTheEnvironmentSets(t *testing.T) {
	vars := map[string]string{cli.EnvMaxConcurrent: "4", cli.EnvQueueWait: "20ms"}
	r := runCmd(t, vars, "policy")
	if r.Code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %q", r.Code, r.Stderr)
	}
	clitest.WantCells(t, r.Stdout,
		"4 from BULKHEAD_MAX_CONCURRENT=4",
		"10 default, BULKHEAD_MAX_QUEUE unset",
		"20ms from BULKHEAD_QUEUE_WAIT=20ms",
		"connections per instance 18 at most B + (B+Q) = 4 + 14",
	)
}

func TestPolicyReportsTheLibraryErrorNamingTheVariable(t *testing.T) {
	cases := map[string]map[string]string{
		cli.EnvMaxConcurrent: {cli.EnvMaxConcurrent: "0"},
		cli.EnvMaxQueue:      {cli.EnvMaxQueue: "+4"},
		cli.EnvQueueWait:     {cli.EnvQueueWait: "1e9"},
		cli.EnvAdaptive:      {cli.EnvAdaptive: "1"},
		cli.EnvMinConcurrent: {cli.EnvAdaptive: "true", cli.EnvMinConcurrent: "0x2"},
	}
	for name, vars := range cases {
		t.Run(name, func(t *testing.T) {
			r := runCmd(t, vars, "policy")
			clitest.WantOneLineError(t, r, "policy:", name, `"`+vars[name]+`"`, "want")
			if r.Stdout != "" {
				t.Errorf("stdout %q, want nothing", r.Stdout)
			}
		})
	}
}

func TestPolicyShowsTheFleetAndItsConnections(t *testing.T) {
	r := runCmd(t, map[string]string{cli.EnvFleet: "orders", cli.EnvMaxConcurrent: "8"}, "policy", "--max-queue", "4")
	if r.Code != cli.ExitOK || r.Stderr != "" {
		t.Fatalf("exit %d, stderr %q", r.Code, r.Stderr)
	}
	clitest.WantCells(t, r.Stdout,
		"fleet orders from BULKHEAD_FLEET=orders: B=8 and Q=4 are the whole fleet's",
		"connections per instance its share of T, + 1 the fleet's: T = 8 for operations in all, + 1 coordination session per instance",
	)
	// A name the library refuses, from the variable or the flag.
	clitest.WantOneLineError(t, runCmd(t, map[string]string{cli.EnvFleet: "Orders!"}, "policy"), "policy:", `BULKHEAD_FLEET="Orders!"`, "--fleet overrides it")
	if r := runCmd(t, map[string]string{cli.EnvFleet: "Orders!"}, "policy", "--fleet", "orders"); r.Code != cli.ExitOK {
		t.Errorf("--fleet over a bad BULKHEAD_FLEET: exit %d, stderr %q", r.Code, r.Stderr)
	}
}
