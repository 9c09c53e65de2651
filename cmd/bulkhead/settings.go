package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dbbulkhead/bulkhead"
)

// The tool's settings. Each is a flag and, for most, an environment
// variable; every command reads them the same way:
//
//	flag > environment variable > default
//
// A setting a command does not use is an error when given as a flag (it
// would do nothing); its environment variable is then not read at all.
// The table below is the one place they are described: the help of every
// command, the README's table and the unknown-variable warning come from
// it.

// setting is one input of the tool.
type setting struct {
	flag string // without the dashes
	env  string // "" for a flag alone
	what string // what it sets, for help
	form string // what a value looks like
	def  string // the default, for help
}

// The settings of the policy, in the order the library documents them.
const (
	setDSN       = "dsn"
	setB         = "max-concurrent"
	setQ         = "max-queue"
	setWait      = "queue-wait"
	setDryRun    = "dry-run"
	setWorkloads = "workloads"
	setFleet     = "fleet"
)

var settings = []setting{
	{flag: setDSN, env: "DATABASE_URL", what: "the database", form: "postgres://... or mysql://...", def: "embedded SQLite (budget, fleet: none, required)"},
	{flag: setB, env: bulkhead.EnvMaxConcurrent, what: "B, operations running at once", form: "integer ≥ 1", def: "10 (overload: the number of CPUs; fleet: T = 8)"},
	{flag: setQ, env: bulkhead.EnvMaxQueue, what: "Q, operations waiting for a permit", form: "integer ≥ 0", def: "10 (overload: max(B, ⌊C·wait⌋); fleet: max(B, ⌊B/S·wait⌋))"},
	{flag: setWait, env: bulkhead.EnvQueueWait, what: "longest wait for a permit", form: "duration 0s to 1h, e.g. 20ms", def: "100ms (overload: deadline − 2·B/C; fleet: deadline − 2·S)"},
	{flag: setDryRun, env: bulkhead.EnvDryRun, what: "count what the gate would reject, reject nothing", form: "true or false", def: "false"},
	{flag: setWorkloads, env: bulkhead.EnvWorkloads, what: "named budgets inside the policy", form: "name:B:Q:wait,... e.g. batch:2:4:50ms", def: "none"},
	{flag: setFleet, env: bulkhead.EnvFleet, what: "a fleet budget: B and Q are the whole fleet's, shared by its instances", form: "name of a-z, 0-9, _ and -", def: "none"},
}

// knownEnv are the BULKHEAD_* variables the library and the tool read.
func knownEnv() []string {
	var names []string
	for _, s := range settings {
		if strings.HasPrefix(s.env, "BULKHEAD_") {
			names = append(names, s.env)
		}
	}
	return names
}

// testEnvPrefix starts the variables of this repository's test suites
// (BULKHEAD_TEST_DATABASE_URL, ...): the tool neither reads nor warns
// about them.
const testEnvPrefix = "BULKHEAD_TEST_"

// warnUnknownEnv writes one line on stderr for each BULKHEAD_* variable
// of the environment that nothing reads: a misspelt name would otherwise
// be ignored without a word.
func (e *env) warnUnknownEnv() {
	if e.environ == nil {
		return
	}
	known := knownEnv()
	var unknown []string
	for _, kv := range e.environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "BULKHEAD_") && !strings.HasPrefix(name, testEnvPrefix) && !slices.Contains(known, name) {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	for _, name := range slices.Compact(unknown) {
		hint := ""
		if near := nearest(name, known); near != "" {
			hint = fmt.Sprintf(" (did you mean %s?)", near)
		}
		fmt.Fprintf(e.stderr, "bulkhead: warning: unknown environment variable %s ignored%s; known: %s\n",
			name, hint, strings.Join(known, ", "))
	}
}

// nearest returns the name of names closest to s, if it is within a few
// edits of it.
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
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
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

// envHelp is the environment section of a command's help: the settings
// it reads from the environment, with their flags and defaults.
func envHelp(uses func(string) bool) string {
	var b strings.Builder
	b.WriteString("Environment (a flag overrides its variable; a variable overrides the default):\n")
	for _, s := range settings {
		if s.env == "" || !uses(s.flag) {
			continue
		}
		fmt.Fprintf(&b, "  %-24s --%-15s %s; default %s\n", s.env, s.flag, s.form, s.def)
	}
	return b.String()
}

// Flag values that know whether they were given, and say what they want
// when they cannot be parsed.

type optInt struct {
	v   int
	set bool
}

func (o *optInt) String() string {
	if o == nil || !o.set {
		return ""
	}
	return strconv.Itoa(o.v)
}

func (o *optInt) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil {
		return errors.New("want a decimal integer")
	}
	o.v, o.set = int(n), true
	return nil
}

func (o *optInt) typeName() string { return "int" }

type optDuration struct {
	v   time.Duration
	set bool
}

func (o *optDuration) String() string {
	if o == nil || !o.set {
		return ""
	}
	return o.v.String()
}

func (o *optDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("want a Go duration with a unit, such as 20ms")
	}
	o.v, o.set = d, true
	return nil
}

func (o *optDuration) typeName() string { return "duration" }

type optBool struct {
	v   bool
	set bool
}

func (o *optBool) String() string {
	if o == nil || !o.set {
		return ""
	}
	return strconv.FormatBool(o.v)
}

func (o *optBool) Set(s string) error {
	switch s {
	case "true":
		o.v = true
	case "false":
		o.v = false
	default:
		return errors.New("want true or false")
	}
	o.set = true
	return nil
}

func (o *optBool) IsBoolFlag() bool { return true }
func (o *optBool) typeName() string { return "" }

type optString struct {
	v   string
	set bool
}

func (o *optString) String() string {
	if o == nil {
		return ""
	}
	return o.v
}

func (o *optString) Set(s string) error {
	o.v, o.set = s, true
	return nil
}

func (o *optString) typeName() string { return "string" }

// policyInput is the policy part of a command line: the five settings of
// bulkhead.Policy as flags, and which of them the command uses.
type policyInput struct {
	cmd  string
	uses map[string]string // setting -> "" if used, else why it does nothing here
	b, q optInt
	wait optDuration
	dry  optBool
	wl   optString
	flt  optString
}

// addPolicyFlags defines the policy flags on fs. unused maps each setting
// the command does not use to the reason, for the error a flag of it
// gets; defaults are the help's default texts that differ from the
// settings table.
func (e *env) addPolicyFlags(fs *flag.FlagSet, unused map[string]string) *policyInput {
	pi := &policyInput{cmd: fs.Name(), uses: unused}
	fs.Var(&pi.b, setB, "B: operations running at once")
	fs.Var(&pi.q, setQ, "Q: operations admitted to wait for a permit")
	fs.Var(&pi.wait, setWait, "longest wait for a permit")
	fs.Var(&pi.dry, setDryRun, "dry run: count what the gate would reject, reject nothing")
	fs.Var(&pi.wl, setWorkloads, "workloads, name:B:Q:wait entries separated by commas, e.g. batch:2:4:50ms (\"\" for none)")
	fs.Var(&pi.flt, setFleet, "fleet: B and Q are those of the whole fleet of that name (see README: Fleets)")
	return pi
}

// uses reports whether the command uses a setting.
func (pi *policyInput) used(name string) bool {
	_, unused := pi.uses[name]
	return !unused
}

// checkUnused returns an error for a flag given that the command does not
// use.
func (pi *policyInput) checkUnused(set map[string]bool) error {
	for _, s := range settings {
		if why, unused := pi.uses[s.flag]; unused && set[s.flag] {
			return fmt.Errorf("--%s does nothing in %s: %s", s.flag, pi.cmd, why)
		}
	}
	return nil
}

// source says where a setting's value came from.
type source int

const (
	fromDefault source = iota
	fromEnv
	fromFlag
)

// resolvedPolicy is the policy a command line and the environment give,
// each field with where it came from.
type resolvedPolicy struct {
	p   bulkhead.Policy
	src map[string]source
	raw map[string]string // the environment's text, for fromEnv
}

func (r *resolvedPolicy) given(name string) bool { return r.src[name] != fromDefault }

// describe says where a setting came from, for errors and the policy
// command.
func (r *resolvedPolicy) describe(name string) string {
	s := settingNamed(name)
	switch r.src[name] {
	case fromFlag:
		return "from --" + name
	case fromEnv:
		return fmt.Sprintf("from %s=%s", s.env, r.raw[name])
	}
	return fmt.Sprintf("default, %s unset", s.env)
}

func settingNamed(name string) setting {
	for _, s := range settings {
		if s.flag == name {
			return s
		}
	}
	panic("no setting " + name)
}

// onlyLookup returns a lookup that sees one variable of lookup.
func onlyLookup(lookup func(string) (string, bool), name string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		if k != name {
			return "", false
		}
		return lookup(k)
	}
}

// parseEnvAlone parses one BULKHEAD_* variable with the library's own
// parser, on a base policy that no value of that variable alone makes
// invalid: the policy as a whole is checked once all its fields are known.
func parseEnvAlone(lookup func(string) (string, bool), name string) (bulkhead.Policy, error) {
	base := bulkhead.Policy{MaxConcurrent: 1}
	switch name {
	case bulkhead.EnvMaxQueue:
		base.QueueWait = bulkhead.MaxQueueWait
	case bulkhead.EnvWorkloads:
		base.MaxConcurrent = math.MaxInt32
	}
	p, err := bulkhead.PolicyFromLookup(base, onlyLookup(lookup, name))
	if err != nil {
		// The whole-policy check adds the variables it was read from:
		// only this one counts here.
		if u := errors.Unwrap(err); u != nil {
			err = u
		}
	}
	return p, err
}

// resolve returns the policy from the flags, the environment (through
// lookup) and def, field by field: flag > environment > default. A
// variable a flag overrides is not read, so a malformed one is no error
// then. It does not check the policy as a whole: see check.
func (pi *policyInput) resolve(lookup func(string) (string, bool), set map[string]bool, def bulkhead.Policy) (*resolvedPolicy, error) {
	if err := pi.checkUnused(set); err != nil {
		return nil, err
	}
	r := &resolvedPolicy{p: def, src: map[string]source{}, raw: map[string]string{}}
	r.p.Workloads = nil
	for _, s := range settings {
		if s.flag == setDSN || !pi.used(s.flag) {
			continue
		}
		if set[s.flag] {
			r.src[s.flag] = fromFlag
			if err := pi.fromFlag(s.flag, &r.p); err != nil {
				return nil, err
			}
			continue
		}
		v, ok := lookup(s.env)
		if !ok {
			continue
		}
		p, err := parseEnvAlone(lookup, s.env)
		if err != nil {
			return nil, fmt.Errorf("%w (--%s overrides it)", err, s.flag)
		}
		r.src[s.flag], r.raw[s.flag] = fromEnv, v
		switch s.flag {
		case setB:
			r.p.MaxConcurrent = p.MaxConcurrent
		case setQ:
			r.p.MaxQueue = p.MaxQueue
		case setWait:
			r.p.QueueWait = p.QueueWait
		case setDryRun:
			r.p.DryRun = p.DryRun
		case setWorkloads:
			r.p.Workloads = p.Workloads
		case setFleet:
			r.p.Fleet = p.Fleet
		}
	}
	return r, nil
}

// fromFlag checks a policy flag's value and sets it in p.
func (pi *policyInput) fromFlag(name string, p *bulkhead.Policy) error {
	switch name {
	case setB:
		if pi.b.v < 1 {
			return fmt.Errorf("--max-concurrent is %d, want an integer from 1 to %d", pi.b.v, math.MaxInt32)
		}
		p.MaxConcurrent = pi.b.v
	case setQ:
		if pi.q.v < 0 {
			return fmt.Errorf("--max-queue is %d, want an integer from 0 to %d", pi.q.v, math.MaxInt32)
		}
		p.MaxQueue = pi.q.v
	case setWait:
		if pi.wait.v < 0 || pi.wait.v > bulkhead.MaxQueueWait {
			return fmt.Errorf("--queue-wait is %v, want 0s to %v", pi.wait.v, bulkhead.MaxQueueWait)
		}
		p.QueueWait = pi.wait.v
	case setDryRun:
		p.DryRun = pi.dry.v
	case setWorkloads:
		// The library's parser, on the flag's text; its message then
		// names the flag instead of the variable.
		lookup := func(k string) (string, bool) { return pi.wl.v, k == bulkhead.EnvWorkloads }
		w, err := parseEnvAlone(lookup, bulkhead.EnvWorkloads)
		if err != nil {
			return errors.New(strings.Replace(strings.TrimPrefix(err.Error(), "bulkhead: "), bulkhead.EnvWorkloads, "--workloads", 1))
		}
		p.Workloads = w.Workloads
	case setFleet:
		lookup := func(k string) (string, bool) { return pi.flt.v, k == bulkhead.EnvFleet }
		f, err := parseEnvAlone(lookup, bulkhead.EnvFleet)
		if err != nil {
			return errors.New(strings.Replace(strings.TrimPrefix(err.Error(), "bulkhead: "), bulkhead.EnvFleet, "--fleet", 1))
		}
		p.Fleet = f.Fleet
	}
	return nil
}

// check validates the policy as a whole; its error names where each
// field came from.
func (r *resolvedPolicy) check() error {
	if err := r.p.Validate(); err != nil {
		parts := []string{
			fmt.Sprintf("B=%d %s", r.p.MaxConcurrent, r.describe(setB)),
			fmt.Sprintf("Q=%d %s", r.p.MaxQueue, r.describe(setQ)),
			fmt.Sprintf("wait=%v %s", r.p.QueueWait, r.describe(setWait)),
		}
		if len(r.p.Workloads) > 0 {
			parts = append(parts, "workloads "+r.describe(setWorkloads))
		}
		if r.p.Fleet != "" {
			parts = append(parts, "fleet "+r.describe(setFleet))
		}
		return fmt.Errorf("%w (%s)", err, strings.Join(parts, ", "))
	}
	return nil
}

// workloadNames lists the workloads of p, sorted.
func workloadNames(p bulkhead.Policy) []string {
	names := make([]string, 0, len(p.Workloads))
	for n := range p.Workloads {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
