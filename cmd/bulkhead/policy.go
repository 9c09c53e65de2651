package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
)

const policyUsage = `Usage: bulkhead policy [--max-concurrent B] [--max-queue Q] [--queue-wait D] [--dry-run] [--workloads W] [--adaptive [--min-concurrent M]] [--fleet NAME]

Prints the policy that the flags and the BULKHEAD_* environment give, as
bulkhead.PolicyFromEnv reads the variables: each setting, its value and
where it came from (flag, variable or default), dry-run, the workloads
and their priorities, adaptive B and its floor, the fleet, and the
server connections one instance keeps open (see bulkhead budget --help:
B, plus one per *sql.Conn kept open and per Ping, Prepare or Raw running
at once; in a fleet, its share of T plus its coordination session and
its anchor). A malformed
variable is an error that names it, its value and what is expected, and
the flag that overrides it (exit 2).
`

const policyExamples = `  bulkhead policy
  BULKHEAD_MAX_CONCURRENT=4 BULKHEAD_MAX_QUEUE=8 BULKHEAD_QUEUE_WAIT=20ms bulkhead policy
  BULKHEAD_WORKLOADS=batch:2:4:50ms bulkhead policy --dry-run
  BULKHEAD_WORKLOADS=batch:2:4:50ms:-1,orders:4:4:50ms:10 bulkhead policy
  BULKHEAD_ADAPTIVE=true BULKHEAD_MIN_CONCURRENT=2 bulkhead policy --max-concurrent 16
  BULKHEAD_FLEET=orders BULKHEAD_MAX_CONCURRENT=8 bulkhead policy
`

func (e *env) policy(_ context.Context, args []string) int {
	fs := e.NewFlagSet("policy", policyUsage, policyExamples)
	fs.String("dsn", "", "database URL (not used: the policy command connects to nothing)")
	pi := e.AddPolicyFlags(fs)
	set, code, done := pi.Parse(args)
	if done {
		return code
	}
	r, err := pi.ResolveChecked(set, bulkhead.DefaultPolicy, (*cli.Resolved).Check)
	if err != nil {
		return e.Fail(fmt.Errorf("policy: %w", err))
	}
	p := r.P
	tw := tabwriter.NewWriter(e.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "max concurrent (B)\t%d\t%s\n", p.MaxConcurrent, r.Describe(cli.SetB))
	fmt.Fprintf(tw, "max queue (Q)\t%d\t%s\n", p.MaxQueue, r.Describe(cli.SetQ))
	fmt.Fprintf(tw, "queue wait\t%v\t%s\n", p.QueueWait, r.Describe(cli.SetWait))
	fmt.Fprintf(tw, "dry run\t%v\t%s\n", p.DryRun, r.Describe(cli.SetDryRun))
	names := cli.WorkloadNames(p)
	if len(names) == 0 {
		fmt.Fprintf(tw, "workloads\tnone\t%s\n", r.Describe(cli.SetWorkloads))
	} else {
		fmt.Fprintf(tw, "workloads\t%d\t%s\n", len(names), r.Describe(cli.SetWorkloads))
		for _, n := range names {
			w := p.Workloads[n]
			fmt.Fprintf(tw, "  workload %s\t%s\twithin the policy's B and B+Q, its priority in the policy's queue (higher first)\n", n, cli.WorkloadSetup(w, true))
		}
	}
	if p.Adaptive {
		fmt.Fprintf(tw, "adaptive\t%v\t%s: the B in force moves from %d to B=%d by the hold times measured\n",
			p.Adaptive, r.Describe(cli.SetAdaptive), cli.MinConcurrent(p), p.MaxConcurrent)
		fmt.Fprintf(tw, "min concurrent\t%d\t%s\n", cli.MinConcurrent(p), r.Describe(cli.SetMinB))
	} else {
		fmt.Fprintf(tw, "adaptive\t%v\t%s\n", p.Adaptive, r.Describe(cli.SetAdaptive))
		fmt.Fprintf(tw, "min concurrent\tnone\t%s: adaptive only\n", r.Describe(cli.SetMinB))
	}
	if r.Fleet == "" {
		fmt.Fprintf(tw, "fleet\tnone\t%s\n", r.Describe(cli.SetFleet))
	} else {
		fmt.Fprintf(tw, "fleet\t%s\t%s: B=%d and Q=%d are the whole fleet's, each instance runs on its share\n", r.Fleet, r.Describe(cli.SetFleet), p.MaxConcurrent, p.MaxQueue)
	}
	fmt.Fprintf(tw, "connections per instance\t%s\n", connsPerInstance(p, r.Fleet).policyCell())
	tw.Flush()
	return cli.ExitOK
}
