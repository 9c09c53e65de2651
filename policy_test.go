//go:build go1.25

package bulkhead

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestPolicyValidateNamesTheInvalidFieldAndItsValue(t *testing.T) {
	tests := []struct {
		name string
		p    Policy
		want []string // substrings of the message
	}{
		{"no execution permit", Policy{MaxConcurrent: 0, MaxQueue: 1, QueueWait: time.Second}, []string{"MaxConcurrent is 0", "at least 1"}},
		{"negative MaxConcurrent", Policy{MaxConcurrent: -3, MaxQueue: 1}, []string{"MaxConcurrent is -3", "at least 1"}},
		{"most negative MaxConcurrent", Policy{MaxConcurrent: math.MinInt}, []string{"MaxConcurrent is " + strconv.Itoa(math.MinInt)}},
		{"negative MaxQueue", Policy{MaxConcurrent: 1, MaxQueue: -1}, []string{"MaxQueue is -1", "at least 0"}},
		{"B+Q just over int32", Policy{MaxConcurrent: math.MaxInt32, MaxQueue: 1}, []string{"MaxConcurrent+MaxQueue is 2147483647+1", "at most 2147483647"}},
		{"Q alone over int32", Policy{MaxConcurrent: 1, MaxQueue: math.MaxInt32}, []string{"MaxConcurrent+MaxQueue is 1+2147483647"}},
		{"B alone over int32", Policy{MaxConcurrent: math.MaxInt32 + 1}, []string{"MaxConcurrent+MaxQueue is 2147483648+0"}},
		{"B and Q at the int maximum", Policy{MaxConcurrent: math.MaxInt, MaxQueue: math.MaxInt}, []string{"MaxConcurrent+MaxQueue is " + strconv.Itoa(math.MaxInt) + "+" + strconv.Itoa(math.MaxInt)}},
		{"negative QueueWait", Policy{MaxConcurrent: 1, QueueWait: -time.Millisecond}, []string{"QueueWait is -1ms", "at least 0"}},
		{"QueueWait over the maximum", Policy{MaxConcurrent: 1, QueueWait: MaxQueueWait + time.Nanosecond}, []string{"QueueWait is 1h0m0.000000001s", "at most 1h0m0s"}},
		{"a queue nobody may wait in", Policy{MaxConcurrent: 1, MaxQueue: 4}, []string{"MaxQueue is 4 with QueueWait 0s", "want QueueWait above 0s or MaxQueue 0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			if err == nil {
				t.Fatalf("Validate(%+v) = nil, want an error", tt.p)
			}
			polCheckMessage(t, err, tt.want...)
		})
	}

	valid := []Policy{
		{MaxConcurrent: 1},
		DefaultPolicy,
		{MaxConcurrent: math.MaxInt32},
		{MaxConcurrent: 1, MaxQueue: math.MaxInt32 - 1, QueueWait: time.Nanosecond},
		{MaxConcurrent: 1000, MaxQueue: math.MaxInt32 - 1000, QueueWait: MaxQueueWait},
		{MaxConcurrent: 2, MaxQueue: 0, QueueWait: 0},
	}
	for _, p := range valid {
		if err := p.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", p, err)
		}
	}
}

// polCheckMessage fails unless err matches ErrInvalidPolicy only, is one
// line starting with "bulkhead: ", and contains every want.
func polCheckMessage(t *testing.T, err error, want ...string) {
	t.Helper()
	if !errors.Is(err, ErrInvalidPolicy) {
		t.Errorf("errors.Is(%v, ErrInvalidPolicy) = false", err)
	}
	if errors.Is(err, ErrRejected) {
		t.Errorf("policy error %v matches ErrRejected", err)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "bulkhead: ") || strings.ContainsAny(msg, "\n\r") {
		t.Errorf("message %q, want one line starting with \"bulkhead: \"", msg)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("message %q does not contain %q", msg, w)
		}
	}
}

// polRejects fails the test unless PolicyFromEnviron(base, environ) fails
// with the zero Policy and an error polCheckMessage accepts with want.
func polRejects(t *testing.T, base Policy, environ []string, want ...string) {
	t.Helper()
	p, err := PolicyFromEnviron(base, environ)
	if err == nil {
		t.Fatalf("PolicyFromEnviron(%q) = %+v, want an error", environ, p)
	}
	if !samePolicy(p, Policy{}) {
		t.Errorf("with an error the policy is %+v, want the zero Policy", p)
	}
	polCheckMessage(t, err, want...)
}

// polEnviron is env as os.Environ lists it, in key order: absent keys
// are unset.
func polEnviron(env map[string]string) []string {
	var environ []string
	for _, k := range slices.Sorted(maps.Keys(env)) {
		environ = append(environ, k+"="+env[k])
	}
	return environ
}

const (
	polWantCount = "want a decimal integer from %d to 2147483647"
	polWantWait  = "want a Go duration with a unit from 0s to 1h0m0s"
)

func TestPolicyFromLookupRejectsMalformedValues(t *testing.T) {
	// Malformed for every variable.
	common := []string{
		"", "10x", "-1", "1e9", " 4", "4 ", "0x10", "4.0", "+4", "\t4", "4\n", "٤", "1_000",
		"99999999999999999999", "-99999999999999999999", "abc", "NaN", "Inf", "-", "+",
	}
	counts := append(common[:len(common):len(common)], "2147483648", "9223372036854775807", "2h", "50ms", "1,000", "0b1", "0o7")
	waits := append(common[:len(common):len(common)], "20", "1", "-1s", "+1s", "-1ns", "+0s", "2h", "1h0m0.000000001s",
		"61m", "3601s", "1.5", "1 s", "1S", "5 ms", "99999999999999999999h", "1d", "ms", ".s")
	cases := []struct {
		name   string
		values []string
		want   string
	}{
		{envB, append(counts, "0", "00"), fmt.Sprintf(polWantCount, 1)},
		{envQ, counts, fmt.Sprintf(polWantCount, 0)},
		{envWait, waits, polWantWait},
	}
	for _, c := range cases {
		for _, v := range c.values {
			t.Run(c.name+"="+strconv.Quote(v), func(t *testing.T) {
				value := c.name + "=" + strconv.Quote(v)
				if v == "" {
					value = c.name + " is set but empty"
				}
				polRejects(t, DefaultPolicy, polEnviron(map[string]string{c.name: v}), value, c.want)
			})
		}
	}
}

// The documentation says a sign is an error; time.ParseDuration accepts
// "-0s" as zero, so parseWait must refuse a leading '-' itself.
func TestPolicyFromLookupRejectsANegativeZeroQueueWait(t *testing.T) {
	for _, v := range []string{"-0", "-0s", "-0ms", "-0.0s", "-0h0m"} {
		t.Run(v, func(t *testing.T) {
			polRejects(t, DefaultPolicy, polEnviron(map[string]string{envWait: v}), envWait+"="+strconv.Quote(v), polWantWait)
		})
	}
}

func TestPolicyFromLookupParsesValidValues(t *testing.T) {
	base := Policy{MaxConcurrent: 7, MaxQueue: 3, QueueWait: 42 * time.Millisecond}
	tests := []struct {
		env  map[string]string
		want Policy
	}{
		{nil, base},
		{map[string]string{"BULKHEAD_TEST_OTHER": "x", "bulkhead_max_queue": "-1"}, base},
		{map[string]string{envB: "1"}, Policy{MaxConcurrent: 1, MaxQueue: 3, QueueWait: 42 * time.Millisecond}},
		{map[string]string{envB: "0004"}, Policy{MaxConcurrent: 4, MaxQueue: 3, QueueWait: 42 * time.Millisecond}},
		{map[string]string{envQ: "0"}, Policy{MaxConcurrent: 7, MaxQueue: 0, QueueWait: 42 * time.Millisecond}},
		{map[string]string{envQ: "00"}, Policy{MaxConcurrent: 7, MaxQueue: 0, QueueWait: 42 * time.Millisecond}},
		{map[string]string{envWait: "0", envQ: "0"}, Policy{MaxConcurrent: 7, MaxQueue: 0, QueueWait: 0}},
		{map[string]string{envWait: "0s", envQ: "0"}, Policy{MaxConcurrent: 7, MaxQueue: 0, QueueWait: 0}},
		{map[string]string{envWait: "1h"}, Policy{MaxConcurrent: 7, MaxQueue: 3, QueueWait: time.Hour}},
		{map[string]string{envWait: "59m59.999999999s"}, Policy{MaxConcurrent: 7, MaxQueue: 3, QueueWait: time.Hour - time.Nanosecond}},
		{map[string]string{envWait: "1.5s"}, Policy{MaxConcurrent: 7, MaxQueue: 3, QueueWait: 1500 * time.Millisecond}},
		{map[string]string{envWait: "250us"}, Policy{MaxConcurrent: 7, MaxQueue: 3, QueueWait: 250 * time.Microsecond}},
		{map[string]string{envWait: "250µs"}, Policy{MaxConcurrent: 7, MaxQueue: 3, QueueWait: 250 * time.Microsecond}},
		{map[string]string{envWait: "1m30s"}, Policy{MaxConcurrent: 7, MaxQueue: 3, QueueWait: 90 * time.Second}},
		{map[string]string{envB: "20", envQ: "40", envWait: "50ms"}, Policy{MaxConcurrent: 20, MaxQueue: 40, QueueWait: 50 * time.Millisecond}},
		{map[string]string{envB: "2147483647", envQ: "0"}, Policy{MaxConcurrent: math.MaxInt32, MaxQueue: 0, QueueWait: 42 * time.Millisecond}},
		{map[string]string{envB: "1", envQ: "2147483646"}, Policy{MaxConcurrent: 1, MaxQueue: math.MaxInt32 - 1, QueueWait: 42 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.env), func(t *testing.T) {
			got, err := PolicyFromEnviron(base, polEnviron(tt.env))
			if err != nil || !samePolicy(got, tt.want) {
				t.Fatalf("PolicyFromEnviron = %+v, %v; want %+v, nil", got, err, tt.want)
			}
		})
	}
}

// Each value is in range, but together B+Q overflow: the error names both
// variables and their values.
func TestPolicyFromLookupRejectsLimitsThatOverflowTogether(t *testing.T) {
	polRejects(t, DefaultPolicy, polEnviron(map[string]string{envB: "2147483647", envQ: "1"}),
		"MaxConcurrent+MaxQueue", `BULKHEAD_MAX_CONCURRENT="2147483647"`, `BULKHEAD_MAX_QUEUE="1"`)
	// Only Q set: B comes from the base policy.
	polRejects(t, DefaultPolicy, polEnviron(map[string]string{envQ: "2147483647"}),
		"MaxConcurrent+MaxQueue is 10+2147483647", `BULKHEAD_MAX_QUEUE="2147483647"`)
}

func TestPolicyFromLookupRejectsAnInvalidBasePolicy(t *testing.T) {
	base := Policy{MaxConcurrent: 0, MaxQueue: 1, QueueWait: time.Second}
	polRejects(t, base, polEnviron(nil), "MaxConcurrent is 0")
	// A valid variable repairs it.
	p, err := PolicyFromEnviron(base, polEnviron(map[string]string{envB: "3"}))
	if err != nil || !samePolicy(p, Policy{MaxConcurrent: 3, MaxQueue: 1, QueueWait: time.Second}) {
		t.Fatalf("got %+v, %v; want B=3 Q=1", p, err)
	}
}

// BULKHEAD_QUEUE_WAIT=0 alone leaves the default queue of 10 that nobody
// may wait in: an error naming the three variables, not a silent queue.
func TestPolicyFromLookupRejectsAQueueWaitOfZeroWithAQueue(t *testing.T) {
	polRejects(t, DefaultPolicy, polEnviron(map[string]string{envWait: "0"}),
		"MaxQueue is 10 with QueueWait 0s", `BULKHEAD_QUEUE_WAIT="0"`, "BULKHEAD_MAX_QUEUE unset")
}

func TestPolicyFromEnvReadsTheProcessEnvironment(t *testing.T) {
	t.Setenv(envB, "3")
	t.Setenv(envQ, "5")
	t.Setenv(envWait, "250ms")
	p, err := PolicyFromEnv()
	if want := (Policy{MaxConcurrent: 3, MaxQueue: 5, QueueWait: 250 * time.Millisecond}); err != nil || !samePolicy(p, want) {
		t.Fatalf("PolicyFromEnv = %+v, %v; want %+v", p, err, want)
	}
	t.Setenv(envWait, "")
	if _, err := PolicyFromEnv(); err == nil {
		t.Fatal("PolicyFromEnv with BULKHEAD_QUEUE_WAIT set but empty succeeded")
	} else {
		polCheckMessage(t, err, "BULKHEAD_QUEUE_WAIT is set but empty")
	}
}

// polStrictCount is an independent, strict reading of a count: only ASCII
// digits, at least one, value from min to MaxInt32.
func polStrictCount(v string, min int64) (int, bool) {
	if v == "" || strings.Trim(v, "0123456789") != "" {
		return 0, false
	}
	n, ok := new(big.Int).SetString(v, 10)
	if !ok || n.Cmp(big.NewInt(min)) < 0 || n.Cmp(big.NewInt(math.MaxInt32)) > 0 {
		return 0, false
	}
	return int(n.Int64()), true
}

// polStrictWait is a strict reading of a queue wait: no sign, a Go
// duration, from 0 to MaxQueueWait.
func polStrictWait(v string) (time.Duration, bool) {
	if v == "" || v[0] == '+' || v[0] == '-' {
		return 0, false
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 || d > MaxQueueWait {
		return 0, false
	}
	return d, true
}

// FuzzPolicyFromLookup checks PolicyFromEnviron against the strict readings
// above. unset has one bit per variable (B, Q, wait) that leaves it unset.
// Property: either the error matches ErrInvalidPolicy, is one line
// starting with "bulkhead:", and names the first bad variable with its
// value; or the policy is valid and equals the strict readings.
func FuzzPolicyFromLookup(f *testing.F) {
	f.Add("4", "8", "50ms", uint8(0))
	f.Add("", "", "", uint8(7))
	f.Add("0", "0", "0", uint8(0))
	f.Add("+4", "-1", "-0s", uint8(0))
	f.Add("2147483647", "1", "1h", uint8(0))
	f.Fuzz(func(t *testing.T, b, q, w string, unset uint8) {
		base := Policy{MaxConcurrent: 10, MaxQueue: 10, QueueWait: 100 * time.Millisecond}
		env := map[string]string{}
		names := []string{envB, envQ, envWait}
		for i, v := range []string{b, q, w} {
			if unset&(1<<i) == 0 {
				env[names[i]] = v
			}
		}
		want, bad := base, ""
		if v, ok := env[envB]; ok {
			n, ok := polStrictCount(v, 1)
			want.MaxConcurrent = n
			if !ok && bad == "" {
				bad = envB
			}
		}
		if v, ok := env[envQ]; ok {
			n, ok := polStrictCount(v, 0)
			want.MaxQueue = n
			if !ok && bad == "" {
				bad = envQ
			}
		}
		if v, ok := env[envWait]; ok {
			d, ok := polStrictWait(v)
			want.QueueWait = d
			if !ok && bad == "" {
				bad = envWait
			}
		}
		overflow := bad == "" && int64(want.MaxConcurrent)+int64(want.MaxQueue) > math.MaxInt32

		got, err := PolicyFromEnviron(base, polEnviron(env))
		if err != nil {
			if !errors.Is(err, ErrInvalidPolicy) {
				t.Fatalf("error %v does not match ErrInvalidPolicy", err)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "bulkhead:") || strings.ContainsAny(msg, "\n\r") {
				t.Fatalf("message %q, want one line starting with bulkhead:", msg)
			}
			if !samePolicy(got, Policy{}) {
				t.Fatalf("with an error the policy is %+v, want zero", got)
			}
			switch {
			case bad != "":
				name := bad
				if env[bad] != "" {
					name += "=" + strconv.Quote(env[bad])
				}
				if !strings.Contains(msg, name) {
					t.Fatalf("message %q does not name %s", msg, name)
				}
			case overflow:
				if !strings.Contains(msg, "MaxConcurrent+MaxQueue") {
					t.Fatalf("message %q does not name the overflow", msg)
				}
			default:
				t.Fatalf("env %q: error %v, want %+v", env, err, want)
			}
			return
		}
		if bad != "" || overflow {
			t.Fatalf("env %q: got %+v, want an error (bad variable %q, overflow %v)", env, got, bad, overflow)
		}
		if !samePolicy(got, want) {
			t.Fatalf("env %q: got %+v, want %+v", env, got, want)
		}
		if err := got.Validate(); err != nil {
			t.Fatalf("returned policy %+v does not validate: %v", got, err)
		}
	})
}

// samePolicy compares policies, maps included.
func samePolicy(a, b Policy) bool { return reflect.DeepEqual(a, b) }

func TestPolicyFromEnvRejectsAnUnknownBulkheadVariableNamingTheNearestKnownName(t *testing.T) {
	t.Setenv("BULKHEAD_MAX_CONCURENT", "2")
	p, err := PolicyFromEnv()
	if err == nil {
		t.Fatalf("PolicyFromEnv with BULKHEAD_MAX_CONCURENT=2 = %+v, want an error", p)
	}
	polCheckMessage(t, err, `unknown environment variable BULKHEAD_MAX_CONCURENT="2"`, "did you mean BULKHEAD_MAX_CONCURRENT?")

	for _, c := range []struct {
		environ []string
		want    string // "" for no error
	}{
		{[]string{"BULKHEAD_QUEUEWAIT=5ms"}, "did you mean BULKHEAD_QUEUE_WAIT?"},
		{[]string{"BULKHEAD_COLOUR=blue"}, `unknown environment variable BULKHEAD_COLOUR="blue" (known: `},
		{[]string{"BULKHEAD_FLEET=orders", "BULKHEAD_TEST_PG=1", "BULKHEADS=2", "PATH=/bin"}, ""},
	} {
		p, err := PolicyFromEnviron(DefaultPolicy, c.environ)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("PolicyFromEnviron(%q): %v, want no error", c.environ, err)
		case c.want == "" && !samePolicy(p, DefaultPolicy):
			t.Errorf("PolicyFromEnviron(%q) = %+v, want DefaultPolicy", c.environ, p)
		case c.want != "" && err == nil:
			t.Errorf("PolicyFromEnviron(%q) = %+v, want an error", c.environ, p)
		case c.want != "":
			polCheckMessage(t, err, c.want) // one line, matching ErrInvalidPolicy
		}
	}
}
