package bulkhead

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
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
	}
	return nil
}

// PolicyFromEnv returns DefaultPolicy with each field that is set in the
// environment replaced:
//
//	BULKHEAD_MAX_CONCURRENT  B, a decimal integer ≥ 1 (default 10)
//	BULKHEAD_MAX_QUEUE       Q, a decimal integer ≥ 0 (default 10)
//	BULKHEAD_QUEUE_WAIT      a Go duration ≥ 0 with a unit, e.g. 50ms (default 100ms)
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
	if err := p.Validate(); err != nil {
		return Policy{}, fmt.Errorf("%w (from %s=%q, %s=%q)", err,
			EnvMaxConcurrent, envShow(lookup, EnvMaxConcurrent), EnvMaxQueue, envShow(lookup, EnvMaxQueue))
	}
	return p, nil
}

func envShow(lookup func(string) (string, bool), name string) string {
	if v, ok := lookup(name); ok {
		return v
	}
	return "unset"
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
	if err != nil || v[0] == '+' || d < 0 || d > MaxQueueWait {
		return 0, invalid("%s=%q, want %s", name, v, want)
	}
	return d, nil
}
