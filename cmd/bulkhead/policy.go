package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/dbbulkhead/bulkhead"
)

const policyUsage = `Usage: bulkhead policy [--max-concurrent B] [--max-queue Q] [--queue-wait D] [--dry-run] [--workloads W] [--fleet NAME]

Prints the policy that the flags and the BULKHEAD_* environment give, as
bulkhead.PolicyFromEnv reads the variables: each setting, its value and
where it came from (flag, variable or default), dry-run, the workloads,
the fleet, and the connections one instance keeps at most (B+Q; in a
fleet, its share of them plus its coordination session). A malformed
variable is an error that names it, its value and what is expected, and
the flag that overrides it (exit 2).
`

const policyExamples = `  bulkhead policy
  BULKHEAD_MAX_CONCURRENT=4 BULKHEAD_MAX_QUEUE=8 BULKHEAD_QUEUE_WAIT=20ms bulkhead policy
  BULKHEAD_WORKLOADS=batch:2:4:50ms bulkhead policy --dry-run
  BULKHEAD_FLEET=orders BULKHEAD_MAX_CONCURRENT=8 bulkhead policy
`

func (e *env) policy(_ context.Context, args []string) int {
	fs := e.newFlagSet("policy", policyUsage, policyExamples)
	fs.String("dsn", "", "database URL (not used: the policy command connects to nothing)")
	pi := e.addPolicyFlags(fs, unusedSettings["policy"])
	if code, done := e.parseFlags(fs, args); done {
		return code
	}
	set := flagsSet(fs)
	if set["dsn"] {
		return e.fail(fmt.Errorf("policy: --dsn does nothing in policy: %s", unusedSettings["policy"][setDSN]))
	}
	r, err := pi.resolve(e.lookup, set, bulkhead.DefaultPolicy)
	if err == nil {
		err = r.check()
	}
	if err != nil {
		return e.fail(fmt.Errorf("policy: %w", err))
	}
	p := r.p
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "max concurrent (B)\t%d\t%s\n", p.MaxConcurrent, r.describe(setB))
	fmt.Fprintf(tw, "max queue (Q)\t%d\t%s\n", p.MaxQueue, r.describe(setQ))
	fmt.Fprintf(tw, "queue wait\t%v\t%s\n", p.QueueWait, r.describe(setWait))
	fmt.Fprintf(tw, "dry run\t%v\t%s\n", p.DryRun, r.describe(setDryRun))
	names := workloadNames(p)
	if len(names) == 0 {
		fmt.Fprintf(tw, "workloads\tnone\t%s\n", r.describe(setWorkloads))
	} else {
		fmt.Fprintf(tw, "workloads\t%d\t%s\n", len(names), r.describe(setWorkloads))
		for _, n := range names {
			w := p.Workloads[n]
			fmt.Fprintf(tw, "  workload %s\tB=%d Q=%d wait=%v\twithin the policy's B and B+Q\n", n, w.MaxConcurrent, w.MaxQueue, w.QueueWait)
		}
	}
	if p.Fleet == "" {
		fmt.Fprintf(tw, "fleet\tnone\t%s\n", r.describe(setFleet))
	} else {
		fmt.Fprintf(tw, "fleet\t%s\t%s: B=%d and Q=%d are the whole fleet's, each instance runs on its share\n", p.Fleet, r.describe(setFleet), p.MaxConcurrent, p.MaxQueue)
	}
	conns := fmt.Sprintf("%d\tat most B+Q", p.MaxConcurrent+p.MaxQueue)
	if p.Fleet != "" {
		conns = fmt.Sprintf("at most its share of B+Q, + 1\tthe fleet's: at most B+Q = %d, + 1 coordination session per instance", p.MaxConcurrent+p.MaxQueue)
	}
	if p.DryRun {
		conns = fmt.Sprintf("%d\tB+Q; in dry-run the gate dials beyond it when needed", p.MaxConcurrent+p.MaxQueue)
	}
	fmt.Fprintf(tw, "connections per instance\t%s\n", conns)
	tw.Flush()
	return exitOK
}
