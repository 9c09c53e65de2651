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

// Policy holds the limits of a gate. The zero value is not valid.
type Policy struct {
	// MaxConcurrent (B) is the execution permits: how many operations may
	// run at once; under Adaptive, the ceiling.
	MaxConcurrent int
	// MaxQueue (Q) is how many admitted operations may wait for an
	// execution permit. Admission permits number MaxConcurrent+MaxQueue.
	MaxQueue int
	// QueueWait is the longest an admitted operation waits, earliest deadline first,
	// for an execution permit before ErrQueueTimeout; zero means no wait.
	QueueWait time.Duration
	// DryRun counts and reports what the gate would reject, without rejecting.
	DryRun bool
	// Adaptive moves the B in force (Stats.MaxConcurrent) from MinConcurrent
	// up to MaxConcurrent by the hold times the gate measures
	// (docs/design.md). Workloads keep their own B.
	Adaptive bool
	// MinConcurrent is the floor of Adaptive's B, from 1 (0 means 1) to
	// MaxConcurrent; it must be 0 without Adaptive.
	MinConcurrent int
	// Workloads are named budgets inside this one: an operation whose
	// context names one (WithWorkload) passes its budget, then the global.
	Workloads map[string]Workload
}

// Workload is a named budget inside a Policy: its own B, Q and queue wait,
// and the priority of its operations in the global budget.
type Workload struct {
	MaxConcurrent int           // B of the workload, from 1 to the policy's MaxConcurrent
	MaxQueue      int           // Q of the workload; its B+Q at most the policy's B+Q
	QueueWait     time.Duration // the workload's wait for its permits, in all
	// Priority orders the global queue, higher first (no workload: 0). When
	// the global admission is full, an operation sheds the last waiter in
	// line (of the lowest priority, due last) if of a priority below its
	// own, rejected with ErrAdmissionFull.
	Priority int
}

// The range of Workload.Priority.
const (
	MinPriority = -100
	MaxPriority = 100
)

// MaxQueueWait is the longest QueueWait a policy accepts.
const MaxQueueWait = time.Hour

// DefaultPolicy is PolicyFromEnv's base: B=10, Q=10, a 100ms queue wait.
var DefaultPolicy = Policy{MaxConcurrent: 10, MaxQueue: 10, QueueWait: 100 * time.Millisecond}

// ErrInvalidPolicy is matched (errors.Is) by every error about a policy,
// an option, or the environment variables of a policy.
var ErrInvalidPolicy = errors.New("bulkhead: invalid policy")

// policyError names what is wrong; it matches ErrInvalidPolicy.
type policyError struct{ msg string }

func (e *policyError) Error() string        { return "bulkhead: " + e.msg }
func (e *policyError) Is(target error) bool { return target == ErrInvalidPolicy }

func invalid(format string, args ...any) error {
	return &policyError{msg: fmt.Sprintf(format, args...)}
}

// Validate reports p's first invalid field and its value (ErrInvalidPolicy).
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
	case p.MinConcurrent < 0 || p.MinConcurrent > p.MaxConcurrent:
		return invalid("MinConcurrent is %d, want 0 to MaxConcurrent (%d)", p.MinConcurrent, p.MaxConcurrent)
	case p.MinConcurrent > 0 && !p.Adaptive:
		return invalid("MinConcurrent is %d without Adaptive: a floor nothing moves B to, want Adaptive true or MinConcurrent 0", p.MinConcurrent)
	}
	names := make([]string, 0, len(p.Workloads))
	for name := range p.Workloads {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		w := p.Workloads[name]
		maxQ := p.MaxConcurrent + p.MaxQueue - w.MaxConcurrent
		switch {
		case !validName(name):
			return invalid("workload name %q, want 1 to 64 of a-z, 0-9, _ and -", name)
		case w.MaxConcurrent < 1 || w.MaxConcurrent > p.MaxConcurrent:
			return invalid("workload %q: MaxConcurrent is %d, want 1 to the policy's %d", name, w.MaxConcurrent, p.MaxConcurrent)
		case w.MaxQueue < 0 || w.MaxQueue > maxQ:
			return invalid("workload %q: MaxQueue is %d, want 0 to %d (its B+Q within the policy's %d)", name, w.MaxQueue, maxQ, p.MaxConcurrent+p.MaxQueue)
		case w.QueueWait < 0 || w.QueueWait > MaxQueueWait:
			return invalid("workload %q: QueueWait is %v, want 0s to %v", name, w.QueueWait, MaxQueueWait)
		case w.MaxQueue > 0 && w.QueueWait == 0:
			return invalid("workload %q: MaxQueue is %d with QueueWait 0s: a queue nobody may wait in, want QueueWait above 0s or MaxQueue 0", name, w.MaxQueue)
		case w.Priority < MinPriority || w.Priority > MaxPriority:
			return invalid("workload %q: Priority is %d, want %d to %d", name, w.Priority, MinPriority, MaxPriority)
		}
	}
	return nil
}

// validName reports whether s is 1 to 64 of a-z, 0-9, _ and -.
func validName(s string) bool {
	return s != "" && len(s) <= 64 && strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789_-") == ""
}

// The BULKHEAD_* environment variables this module reads.
const (
	envB         = "BULKHEAD_MAX_CONCURRENT"
	envQ         = "BULKHEAD_MAX_QUEUE"
	envWait      = "BULKHEAD_QUEUE_WAIT"
	envDryRun    = "BULKHEAD_DRY_RUN"
	envWorkloads = "BULKHEAD_WORKLOADS"
	envAdaptive  = "BULKHEAD_ADAPTIVE"
	envMin       = "BULKHEAD_MIN_CONCURRENT"
	envFleet     = "BULKHEAD_FLEET" // read by package fleet
	envTest      = "BULKHEAD_TEST_" // the prefix of this repository's tests' variables
)

// envKnown: the policy's variables first (envPolicy of them), then the others.
var envKnown = []string{envB, envQ, envWait, envDryRun, envWorkloads, envAdaptive, envMin, envFleet}

const envPolicy = 7

// PolicyFromEnv returns DefaultPolicy with each field that is set in the
// environment replaced:
//
//	BULKHEAD_MAX_CONCURRENT  B, a decimal integer ≥ 1 (default 10)
//	BULKHEAD_MAX_QUEUE       Q, a decimal integer ≥ 0 (default 10)
//	BULKHEAD_QUEUE_WAIT      a Go duration with a unit, 0s to 1h, e.g. 50ms (default 100ms)
//	BULKHEAD_DRY_RUN         true or false (default false)
//	BULKHEAD_WORKLOADS       name:B:Q:wait[:priority], comma-separated, e.g. batch:2:4:50ms:-1 (default none)
//	BULKHEAD_ADAPTIVE        true or false (default false): B moves up to BULKHEAD_MAX_CONCURRENT
//	BULKHEAD_MIN_CONCURRENT  Adaptive's floor, a decimal integer ≥ 1 (default 1)
//
// A variable that is set must be well formed (plain digits, a duration
// with a unit, within range); any other BULKHEAD_* variable, but
// BULKHEAD_FLEET and BULKHEAD_TEST_*, is unknown. Errors name the
// variable, its value and what is expected, and match ErrInvalidPolicy.
func PolicyFromEnv() (Policy, error) {
	return PolicyFromEnviron(DefaultPolicy, os.Environ())
}

// PolicyFromEnviron is PolicyFromEnv with the base policy and environment
// (as os.Environ returns it) given; of repeated keys, the last counts.
func PolicyFromEnviron(base Policy, environ []string) (Policy, error) {
	vars := map[string]string{}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, "BULKHEAD_") || strings.HasPrefix(k, envTest) {
			continue
		}
		if !slices.Contains(envKnown, k) {
			hint := ""
			if near := nearest(k, envKnown); near != "" {
				hint = ", did you mean " + near + "?"
			}
			return Policy{}, invalid("unknown environment variable %s=%q%s (known: %s)", k, v, hint, strings.Join(envKnown[:envPolicy], ", "))
		}
		vars[k] = v
	}
	p := base
	var err error
	if v, ok := vars[envB]; ok && err == nil {
		p.MaxConcurrent, err = parseCount(envB, v, 1)
	}
	if v, ok := vars[envQ]; ok && err == nil {
		p.MaxQueue, err = parseCount(envQ, v, 0)
	}
	if v, ok := vars[envWait]; ok && err == nil {
		p.QueueWait, err = parseWait(envWait, v)
	}
	if v, ok := vars[envDryRun]; ok && err == nil {
		p.DryRun, err = parseBool(envDryRun, v)
	}
	if v, ok := vars[envAdaptive]; ok && err == nil {
		p.Adaptive, err = parseBool(envAdaptive, v)
	}
	if v, ok := vars[envMin]; ok && err == nil {
		p.MinConcurrent, err = parseCount(envMin, v, 1)
	}
	if v, ok := vars[envWorkloads]; ok && err == nil {
		p.Workloads, err = parseWorkloads(v)
	}
	if err != nil {
		return Policy{}, err
	}
	if err := p.Validate(); err != nil {
		var from []string
		for _, k := range envKnown[:envPolicy] {
			v, ok := vars[k]
			switch {
			case ok:
				from = append(from, k+"="+strconv.Quote(v))
			case k == envB || k == envQ || k == envWait:
				from = append(from, k+" unset")
			}
		}
		return Policy{}, fmt.Errorf("%w (from %s)", err, strings.Join(from, ", "))
	}
	return p, nil
}

// nearest returns the name of names closest to s, if within a few edits.
func nearest(s string, names []string) string {
	best, bestD := "", 4
	for _, n := range names {
		if d := editDistance(s, n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func parseBool(name, v string) (bool, error) {
	if v != "true" && v != "false" {
		return false, invalid("%s=%q, want true or false", name, v)
	}
	return v == "true", nil
}

// parseCount accepts plain decimal digits only (no sign).
func parseCount(name, v string, min int) (int, error) {
	want := fmt.Sprintf("a decimal integer from %d to %d", min, math.MaxInt32)
	if v == "" {
		return 0, invalid("%s is set but empty, want %s", name, want)
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || int(n) < min || strings.Trim(v, "0123456789") != "" {
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

// parseWorkloads reads BULKHEAD_WORKLOADS; empty means no workloads.
func parseWorkloads(v string) (map[string]Workload, error) {
	const want = "name:B:Q:wait[:priority] entries separated by commas, e.g. batch:2:4:50ms:-1"
	ws := map[string]Workload{}
	if v == "" {
		return ws, nil
	}
	for _, entry := range strings.Split(v, ",") {
		f := strings.Split(entry, ":")
		if len(f) != 4 && len(f) != 5 {
			return nil, invalid("%s=%q: entry %q, want %s", envWorkloads, v, entry, want)
		}
		name := f[0]
		if !validName(name) {
			return nil, invalid("%s=%q: workload name %q, want 1 to 64 of a-z, 0-9, _ and -", envWorkloads, v, name)
		}
		if _, dup := ws[name]; dup {
			return nil, invalid("%s=%q: workload %q appears twice, want each name once", envWorkloads, v, name)
		}
		b, err := parseCount(envWorkloads+" "+name+" B", f[1], 1)
		if err != nil {
			return nil, err
		}
		q, err := parseCount(envWorkloads+" "+name+" Q", f[2], 0)
		if err != nil {
			return nil, err
		}
		d, err := parseWait(envWorkloads+" "+name+" wait", f[3])
		if err != nil {
			return nil, err
		}
		prio := 0
		if len(f) == 5 {
			prio, err = strconv.Atoi(f[4])
			if err != nil || prio < MinPriority || prio > MaxPriority || f[4] != strconv.Itoa(prio) {
				return nil, invalid("%s=%q: workload %q priority %q, want an integer from %d to %d", envWorkloads, v, name, f[4], MinPriority, MaxPriority)
			}
		}
		ws[name] = Workload{MaxConcurrent: b, MaxQueue: q, QueueWait: d, Priority: prio}
	}
	return ws, nil
}
