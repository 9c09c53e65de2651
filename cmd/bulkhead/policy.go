package main

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/dbbulkhead/bulkhead"
)

const policyUsage = `Usage: bulkhead policy

Prints the policy that bulkhead.PolicyFromEnv gives for this environment:
each BULKHEAD_* variable, its value and whether it was set or defaulted,
and the connections one instance keeps at most (B+Q). A malformed
variable is an error that names it (exit 2).
`

const policyExamples = `  bulkhead policy
  BULKHEAD_MAX_CONCURRENT=4 BULKHEAD_MAX_QUEUE=8 BULKHEAD_QUEUE_WAIT=20ms bulkhead policy
`

func (e *env) policy(_ context.Context, args []string) int {
	fs := e.newFlagSet("policy", policyUsage, policyExamples)
	if code, done := e.parseFlags(fs, args); done {
		return code
	}
	p, err := bulkhead.PolicyFromLookup(bulkhead.DefaultPolicy, e.lookup)
	if err != nil {
		return e.fail(err)
	}
	from := func(name string) string {
		if v, ok := e.lookup(name); ok {
			return fmt.Sprintf("from %s=%s", name, v)
		}
		return fmt.Sprintf("default, %s unset", name)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "max concurrent (B)\t%d\t%s\n", p.MaxConcurrent, from(bulkhead.EnvMaxConcurrent))
	fmt.Fprintf(tw, "max queue (Q)\t%d\t%s\n", p.MaxQueue, from(bulkhead.EnvMaxQueue))
	fmt.Fprintf(tw, "queue wait\t%v\t%s\n", p.QueueWait, from(bulkhead.EnvQueueWait))
	fmt.Fprintf(tw, "connections per instance\t%d\tat most B+Q\n", p.MaxConcurrent+p.MaxQueue)
	tw.Flush()
	return exitOK
}

// policyFlags are the --max-concurrent, --max-queue and --queue-wait flags,
// whose defaults come from the environment (bulkhead.PolicyFromEnv).
type policyFlags struct {
	env    bulkhead.Policy
	envErr error
	b, q   *int
	wait   *time.Duration
}

func (e *env) addPolicyFlags(fs *flag.FlagSet) *policyFlags {
	pf := &policyFlags{}
	pf.env, pf.envErr = bulkhead.PolicyFromLookup(bulkhead.DefaultPolicy, e.lookup)
	def := pf.env
	if pf.envErr != nil {
		def = bulkhead.DefaultPolicy
	}
	pf.b = fs.Int("max-concurrent", def.MaxConcurrent, "B: operations running at once; $"+bulkhead.EnvMaxConcurrent+" sets the default")
	pf.q = fs.Int("max-queue", def.MaxQueue, "Q: operations waiting for a permit; $"+bulkhead.EnvMaxQueue+" sets the default")
	pf.wait = fs.Duration("queue-wait", def.QueueWait, "longest wait for a permit; $"+bulkhead.EnvQueueWait+" sets the default")
	return pf
}

// policy returns the effective policy: flags override the environment. A
// malformed environment is an error unless all three flags override it.
func (pf *policyFlags) policy(set map[string]bool) (bulkhead.Policy, error) {
	if pf.envErr != nil && !(set["max-concurrent"] && set["max-queue"] && set["queue-wait"]) {
		return bulkhead.Policy{}, pf.envErr
	}
	p := bulkhead.Policy{MaxConcurrent: *pf.b, MaxQueue: *pf.q, QueueWait: *pf.wait}
	switch {
	case p.MaxConcurrent < 1:
		return p, fmt.Errorf("--max-concurrent is %d, want at least 1", p.MaxConcurrent)
	case p.MaxQueue < 0:
		return p, fmt.Errorf("--max-queue is %d, want at least 0", p.MaxQueue)
	case p.QueueWait < 0 || p.QueueWait > bulkhead.MaxQueueWait:
		return p, fmt.Errorf("--queue-wait is %v, want 0s to %v", p.QueueWait, bulkhead.MaxQueueWait)
	}
	if err := p.Validate(); err != nil {
		return p, fmt.Errorf("--max-concurrent %d, --max-queue %d: %w", p.MaxConcurrent, p.MaxQueue, err)
	}
	return p, nil
}
