//go:build go1.25

package bulkhead

// Policy.Adaptive and MinConcurrent: Validate and the environment.

import (
	"strconv"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead/internal/fakedb"
)

const (
	envAdaptiveName = "BULKHEAD_ADAPTIVE"
	envMinName      = "BULKHEAD_MIN_CONCURRENT"
)

// Each invalid MinConcurrent is an error naming the field, its value and
// what is wanted, matching ErrInvalidPolicy.
func TestAdaptivePolicyValidateNamesMinConcurrentAndItsValue(t *testing.T) {
	for _, c := range []struct {
		name string
		p    Policy
		want []string
	}{
		{"negative", Policy{MaxConcurrent: 4, Adaptive: true, MinConcurrent: -1}, []string{"MinConcurrent is -1", "want 0 to MaxConcurrent (4)"}},
		{"negative without Adaptive", Policy{MaxConcurrent: 4, MinConcurrent: -2}, []string{"MinConcurrent is -2", "want 0 to MaxConcurrent (4)"}},
		{"above MaxConcurrent", Policy{MaxConcurrent: 4, Adaptive: true, MinConcurrent: 5}, []string{"MinConcurrent is 5", "want 0 to MaxConcurrent (4)"}},
		{"without Adaptive", Policy{MaxConcurrent: 4, MinConcurrent: 2}, []string{"MinConcurrent is 2 without Adaptive", "want Adaptive true or MinConcurrent 0"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.p.Validate()
			if err == nil {
				t.Fatalf("Validate(%+v) = nil, want an error", c.p)
			}
			polCheckMessage(t, err, c.want...)
			if _, err := New(fakedb.New(), c.p); err == nil {
				t.Fatalf("New with %+v succeeded, want Validate's error", c.p)
			}
		})
	}
	for _, p := range []Policy{
		{MaxConcurrent: 4, Adaptive: true},
		{MaxConcurrent: 4, Adaptive: true, MinConcurrent: 1},
		{MaxConcurrent: 4, Adaptive: true, MinConcurrent: 4},
		{MaxConcurrent: 1, Adaptive: true, MinConcurrent: 1},
		{MaxConcurrent: 4, MaxQueue: 4, QueueWait: time.Second, Adaptive: true, MinConcurrent: 2, DryRun: true},
	} {
		if err := p.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", p, err)
		}
	}
}

// The two variables set Adaptive and MinConcurrent over the base policy;
// unset, the base's stay.
func TestAdaptivePolicyFromTheEnvironment(t *testing.T) {
	def := func(adaptive bool, min int) Policy {
		p := DefaultPolicy
		p.Adaptive, p.MinConcurrent = adaptive, min
		return p
	}
	base := def(true, 3)
	for _, c := range []struct {
		name    string
		base    Policy
		environ []string
		want    Policy
	}{
		{"both", DefaultPolicy, []string{envAdaptiveName + "=true", envMinName + "=2"}, def(true, 2)},
		{"adaptive alone: floor 0 (1)", DefaultPolicy, []string{envAdaptiveName + "=true"}, def(true, 0)},
		{"floor at B", DefaultPolicy, []string{envAdaptiveName + "=true", envMinName + "=10"}, def(true, 10)},
		{"leading zeros", DefaultPolicy, []string{envAdaptiveName + "=true", envMinName + "=002"}, def(true, 2)},
		{"false", DefaultPolicy, []string{envAdaptiveName + "=false"}, def(false, 0)},
		{"unset: the base's", base, nil, base},
		{"the last of a key counts", DefaultPolicy, []string{envAdaptiveName + "=false", envAdaptiveName + "=true", envMinName + "=2"}, def(true, 2)},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := PolicyFromEnviron(c.base, c.environ)
			if err != nil || !samePolicy(got, c.want) {
				t.Fatalf("PolicyFromEnviron(%v) = %+v, %v; want %+v, nil", c.environ, got, err, c.want)
			}
		})
	}
	t.Run("process environment", func(t *testing.T) {
		t.Setenv(envAdaptiveName, "true")
		t.Setenv(envMinName, "2")
		got, err := PolicyFromEnv()
		if err != nil || !got.Adaptive || got.MinConcurrent != 2 {
			t.Fatalf("PolicyFromEnv = %+v, %v; want Adaptive with MinConcurrent 2", got, err)
		}
	})
}

// A malformed value is a one-line error naming the variable, its value
// and what is wanted, and no policy.
func TestAdaptivePolicyFromTheEnvironmentRejectsMalformedValues(t *testing.T) {
	const wantMin = "want a decimal integer from 1 to 2147483647"
	for _, c := range []struct {
		env, v string
		want   []string
	}{
		{envAdaptiveName, "yes", []string{`BULKHEAD_ADAPTIVE="yes"`, "want true or false"}},
		{envAdaptiveName, "", []string{`BULKHEAD_ADAPTIVE=""`, "want true or false"}},
		{envAdaptiveName, "1", []string{`BULKHEAD_ADAPTIVE="1"`, "want true or false"}},
		{envAdaptiveName, "TRUE", []string{`BULKHEAD_ADAPTIVE="TRUE"`}},
		{envAdaptiveName, " true", []string{`BULKHEAD_ADAPTIVE=" true"`}},
		{envMinName, "0", []string{`BULKHEAD_MIN_CONCURRENT="0"`, wantMin}},
		{envMinName, "-1", []string{`BULKHEAD_MIN_CONCURRENT="-1"`, wantMin}},
		{envMinName, "", []string{"BULKHEAD_MIN_CONCURRENT is set but empty", wantMin}},
		{envMinName, "+2", []string{`BULKHEAD_MIN_CONCURRENT="+2"`}},
		{envMinName, "2.0", []string{`BULKHEAD_MIN_CONCURRENT="2.0"`}},
		{envMinName, "2 ", []string{`BULKHEAD_MIN_CONCURRENT="2 "`}},
		{envMinName, "99999999999", []string{`BULKHEAD_MIN_CONCURRENT="99999999999"`}},
	} {
		t.Run(c.env+"="+strconv.Quote(c.v), func(t *testing.T) {
			// With BULKHEAD_ADAPTIVE=true set too, a MinConcurrent that
			// parsed would be valid: the error is the value's.
			environ := []string{c.env + "=" + c.v}
			if c.env == envMinName {
				environ = append(environ, envAdaptiveName+"=true")
			}
			polRejects(t, DefaultPolicy, environ, c.want...)
		})
	}
}

// Well-formed values that make an invalid policy: Validate's error, with
// the variables it came from.
func TestAdaptivePolicyFromTheEnvironmentThatDoesNotValidateNamesTheVariables(t *testing.T) {
	for _, c := range []struct {
		name    string
		environ []string
		want    []string
	}{
		{"a floor without Adaptive", []string{envMinName + "=2"},
			[]string{"MinConcurrent is 2 without Adaptive", `BULKHEAD_MIN_CONCURRENT="2"`}},
		{"a floor without Adaptive, false", []string{envMinName + "=2", envAdaptiveName + "=false"},
			[]string{"MinConcurrent is 2 without Adaptive", `BULKHEAD_MIN_CONCURRENT="2"`, `BULKHEAD_ADAPTIVE="false"`}},
		{"a floor above B", []string{envMinName + "=11", envAdaptiveName + "=true"},
			[]string{"MinConcurrent is 11, want 0 to MaxConcurrent (10)", `BULKHEAD_MIN_CONCURRENT="11"`, "BULKHEAD_MAX_CONCURRENT unset"}},
		{"a floor above B from the environment", []string{envMinName + "=4", envAdaptiveName + "=true", "BULKHEAD_MAX_CONCURRENT=3"},
			[]string{"MinConcurrent is 4, want 0 to MaxConcurrent (3)", `BULKHEAD_MIN_CONCURRENT="4"`, `BULKHEAD_MAX_CONCURRENT="3"`}},
	} {
		t.Run(c.name, func(t *testing.T) { polRejects(t, DefaultPolicy, c.environ, c.want...) })
	}
}

// A misspelt name is refused naming the nearest, and the list of known
// variables names the two new ones.
func TestAdaptivePolicyMisspeltVariablesNameTheNearestKnownOne(t *testing.T) {
	for _, c := range []struct{ typo, near string }{
		{"BULKHEAD_ADAPTIV", envAdaptiveName},
		{"BULKHEAD_MIN_CONCURENT", envMinName},
	} {
		polRejects(t, DefaultPolicy, []string{c.typo + "=true"},
			"unknown environment variable "+c.typo, "did you mean "+c.near+"?", envAdaptiveName, envMinName)
	}
}
