package bulkhead

import (
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Policy holds the limits of a gate.
//
// The zero value is not valid: MaxConcurrent must be at least 1.
type Policy struct {
	// MaxConcurrent (B) is how many operations may run at once: the
	// execution permits.
	MaxConcurrent int
	// MaxQueue (Q) is how many admitted operations may wait for an
	// execution permit. Admission permits number MaxConcurrent+MaxQueue.
	MaxQueue int
	// QueueWait is the longest an admitted operation waits, in FIFO order,
	// for an execution permit before it is rejected with ErrQueueTimeout.
	// Zero means no wait at all.
	QueueWait time.Duration
	// DryRun counts, reports (Stats, events) and logs through events what
	// the gate would reject, without rejecting or waiting: for rolling
	// limits out on a live service. The connector then dials without limit.
	DryRun bool
	// Workloads are named budgets inside this one. An operation whose
	// context names a workload (WithWorkload) passes its budget first, then
	// the global one; untagged operations, and those naming a workload not
	// listed, pass the global budget alone.
	Workloads map[string]Workload
	// Fleet names a fleet budget: every process whose gate names the same
	// fleet, against the same PostgreSQL database, shares MaxConcurrent
	// and MaxQueue, and this gate runs on its share of them (fleet.go,
	// README "Fleets"). Empty: the limits are this process's own.
	Fleet string
}

// Workload is a named budget inside a Policy: its own B, Q and queue wait.
// An operation of the workload takes the workload's permits and the global
// ones, each without ever exceeding its limits.
type Workload struct {
	MaxConcurrent int           // B of the workload, from 1 to the policy's MaxConcurrent
	MaxQueue      int           // Q of the workload; B+Q at most the policy's B+Q
	QueueWait     time.Duration // the workload's wait for its permits, in all
}

// MaxQueueWait is the longest QueueWait a policy accepts. A longer wait in
// front of a database is a mistake, not a configuration.
const MaxQueueWait = time.Hour

// DefaultPolicy is the policy PolicyFromEnv starts from:
// B=10, Q=10, a 100ms queue wait.
var DefaultPolicy = Policy{MaxConcurrent: 10, MaxQueue: 10, QueueWait: 100 * time.Millisecond}

// Environment variables read by PolicyFromEnv.
const (
	EnvMaxConcurrent = "BULKHEAD_MAX_CONCURRENT"
	EnvMaxQueue      = "BULKHEAD_MAX_QUEUE"
	EnvQueueWait     = "BULKHEAD_QUEUE_WAIT"
	EnvDryRun        = "BULKHEAD_DRY_RUN"
	EnvWorkloads     = "BULKHEAD_WORKLOADS"
	EnvFleet         = "BULKHEAD_FLEET"
)

// ErrInvalidPolicy is matched (errors.Is) by every error about a policy or
// its environment variables.
var ErrInvalidPolicy = errors.New("bulkhead: invalid policy")

// policyError names what is wrong; it matches ErrInvalidPolicy.
type policyError struct{ msg string }

func (e *policyError) Error() string        { return "bulkhead: " + e.msg }
func (e *policyError) Is(target error) bool { return target == ErrInvalidPolicy }

func invalid(format string, args ...any) error {
	return &policyError{msg: fmt.Sprintf(format, args...)}
}

// Validate reports the first invalid field of p, naming it and its value.
// The error matches ErrInvalidPolicy.
func (p Policy) Validate() error {
	switch {
	case p.MaxConcurrent < 1:
		return invalid("MaxConcurrent is %d, want at least 1", p.MaxConcurrent)
	case p.MaxQueue < 0:
		return invalid("MaxQueue is %d, want at least 0", p.MaxQueue)
	case p.MaxQueue > math.MaxInt32-p.MaxConcurrent:
		return invalid("MaxConcurrent+MaxQueue is %d+%d, want at most %d in all", p.MaxConcurrent, p.MaxQueue, math.MaxInt32)
	case p.QueueWait < 0:
		return invalid("QueueWait is %v, want at least 0", p.QueueWait)
	case p.QueueWait > MaxQueueWait:
		return invalid("QueueWait is %v, want at most %v", p.QueueWait, MaxQueueWait)
	case p.MaxQueue > 0 && p.QueueWait == 0:
		return invalid("MaxQueue is %d with QueueWait 0s: a queue nobody may wait in, want QueueWait above 0s or MaxQueue 0", p.MaxQueue)
	}
	if p.Fleet != "" && !validName(p.Fleet) {
		return invalid("Fleet is %q, want 1 to 64 of a-z, 0-9, _ and -", p.Fleet)
	}
	for _, name := range sortedNames(p.Workloads) {
		if err := p.Workloads[name].validate(name, p); err != nil {
			return err
		}
	}
	return nil
}

func (w Workload) validate(name string, p Policy) error {
	if !validName(name) {
		return invalid("workload name %q, want 1 to 64 of a-z, 0-9, _ and -", name)
	}
	switch {
	case w.MaxConcurrent < 1 || w.MaxConcurrent > p.MaxConcurrent:
		return invalid("workload %q: MaxConcurrent is %d, want 1 to the policy's %d", name, w.MaxConcurrent, p.MaxConcurrent)
	case w.MaxQueue < 0 || w.MaxQueue > p.MaxConcurrent+p.MaxQueue-w.MaxConcurrent:
		return invalid("workload %q: MaxQueue is %d, want 0 to %d (its B+Q within the policy's %d)", name, w.MaxQueue, p.MaxConcurrent+p.MaxQueue-w.MaxConcurrent, p.MaxConcurrent+p.MaxQueue)
	case w.QueueWait < 0 || w.QueueWait > MaxQueueWait:
		return invalid("workload %q: QueueWait is %v, want 0s to %v", name, w.QueueWait, MaxQueueWait)
	case w.MaxQueue > 0 && w.QueueWait == 0:
		return invalid("workload %q: MaxQueue is %d with QueueWait 0s: a queue nobody may wait in, want QueueWait above 0s or MaxQueue 0", name, w.MaxQueue)
	}
	return nil
}

func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func sortedNames(m map[string]Workload) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// PolicyFromEnv returns DefaultPolicy with each field that is set in the
// environment replaced:
//
//	BULKHEAD_MAX_CONCURRENT  B, a decimal integer ≥ 1 (default 10)
//	BULKHEAD_MAX_QUEUE       Q, a decimal integer ≥ 0 (default 10)
//	BULKHEAD_QUEUE_WAIT      a Go duration ≥ 0 with a unit, e.g. 50ms (default 100ms)
//	BULKHEAD_DRY_RUN         true or false (default false)
//	BULKHEAD_WORKLOADS       name:B:Q:wait, comma-separated, e.g. batch:2:4:50ms,report:1:0:0s (default none)
//	BULKHEAD_FLEET           a fleet's name, 1 to 64 of a-z, 0-9, _ and -: B and Q are then the fleet's (default none)
//
// A variable that is set must be well formed: an empty value, a sign,
// spaces, a fraction, hex or exponent notation, or a number out of range is
// an error naming the variable, its value and what is expected. Nothing is
// silently defaulted.
func PolicyFromEnv() (Policy, error) {
	return PolicyFromLookup(DefaultPolicy, os.LookupEnv)
}

// PolicyFromLookup is PolicyFromEnv with the starting policy and the
// variable lookup given, for tests and for configuration sources other than
// the process environment.
func PolicyFromLookup(base Policy, lookup func(string) (string, bool)) (Policy, error) {
	p := base
	if v, ok := lookup(EnvMaxConcurrent); ok {
		n, err := parseCount(EnvMaxConcurrent, v, 1)
		if err != nil {
			return Policy{}, err
		}
		p.MaxConcurrent = n
	}
	if v, ok := lookup(EnvMaxQueue); ok {
		n, err := parseCount(EnvMaxQueue, v, 0)
		if err != nil {
			return Policy{}, err
		}
		p.MaxQueue = n
	}
	if v, ok := lookup(EnvQueueWait); ok {
		d, err := parseWait(EnvQueueWait, v)
		if err != nil {
			return Policy{}, err
		}
		p.QueueWait = d
	}
	if v, ok := lookup(EnvDryRun); ok {
		switch v {
		case "true":
			p.DryRun = true
		case "false":
			p.DryRun = false
		default:
			return Policy{}, invalid("%s=%q, want true or false", EnvDryRun, v)
		}
	}
	if v, ok := lookup(EnvWorkloads); ok {
		w, err := parseWorkloads(v)
		if err != nil {
			return Policy{}, err
		}
		p.Workloads = w
	}
	if v, ok := lookup(EnvFleet); ok {
		if !validName(v) {
			return Policy{}, invalid("%s=%q, want a fleet name of 1 to 64 of a-z, 0-9, _ and -", EnvFleet, v)
		}
		p.Fleet = v
	}
	if err := p.Validate(); err != nil {
		from := envShow(lookup, EnvMaxConcurrent) + ", " + envShow(lookup, EnvMaxQueue) + ", " + envShow(lookup, EnvQueueWait)
		if _, ok := lookup(EnvWorkloads); ok {
			from += ", " + envShow(lookup, EnvWorkloads)
		}
		return Policy{}, fmt.Errorf("%w (from %s)", err, from)
	}
	return p, nil
}

func envShow(lookup func(string) (string, bool), name string) string {
	if v, ok := lookup(name); ok {
		return name + "=" + strconv.Quote(v)
	}
	return name + " unset"
}

// parseCount accepts only plain decimal digits: strconv.Atoi alone would
// take "+4" and "-1".
func parseCount(name, v string, min int) (int, error) {
	want := fmt.Sprintf("a decimal integer from %d to %d", min, math.MaxInt32)
	if v == "" {
		return 0, invalid("%s is set but empty, want %s", name, want)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, invalid("%s=%q, want %s", name, v, want)
		}
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || int(n) < min {
		return 0, invalid("%s=%q, want %s", name, v, want)
	}
	return int(n), nil
}

func parseWait(name, v string) (time.Duration, error) {
	want := fmt.Sprintf("a Go duration with a unit from 0s to %v, e.g. 50ms", MaxQueueWait)
	if v == "" {
		return 0, invalid("%s is set but empty, want %s", name, want)
	}
	d, err := time.ParseDuration(v) // rejects "20" (no unit) and "1e9"
	if err != nil || v[0] == '+' || v[0] == '-' || d < 0 || d > MaxQueueWait {
		return 0, invalid("%s=%q, want %s", name, v, want)
	}
	return d, nil
}

// parseWorkloads reads name:B:Q:wait entries separated by commas; an
// empty value means no workloads.
func parseWorkloads(v string) (map[string]Workload, error) {
	const want = "name:B:Q:wait entries separated by commas, e.g. batch:2:4:50ms"
	ws := map[string]Workload{}
	if v == "" {
		return ws, nil
	}
	for _, entry := range strings.Split(v, ",") {
		f := strings.Split(entry, ":")
		if len(f) != 4 {
			return nil, invalid("%s=%q: entry %q, want %s", EnvWorkloads, v, entry, want)
		}
		name := f[0]
		if !validName(name) {
			return nil, invalid("%s=%q: workload name %q, want 1 to 64 of a-z, 0-9, _ and -", EnvWorkloads, v, name)
		}
		if _, dup := ws[name]; dup {
			return nil, invalid("%s=%q: workload %q appears twice, want each name once", EnvWorkloads, v, name)
		}
		b, err := parseCount(EnvWorkloads+" "+name+" B", f[1], 1)
		if err != nil {
			return nil, err
		}
		q, err := parseCount(EnvWorkloads+" "+name+" Q", f[2], 0)
		if err != nil {
			return nil, err
		}
		d, err := parseWait(EnvWorkloads+" "+name+" wait", f[3])
		if err != nil {
			return nil, err
		}
		ws[name] = Workload{MaxConcurrent: b, MaxQueue: q, QueueWait: d}
	}
	return ws, nil
}
