package cli

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/fleet"
)

// The settings. Each is a flag and, for most, an environment variable;
// every command reads them the same way:
//
//	flag > environment variable > default
//
// A setting a command does not use is an error when given as a flag (it
// would do nothing); its environment variable is then not read at all.
// The table below is the one place they are described: the help of every
// command comes from it.

// Setting is one input of the programs.
type Setting struct {
	Flag string // without the dashes
	Env  string // its variable
	What string // what it sets, for help
	Form string // what a value looks like
	Def  string // the default, for help; a command may have its own (Command.Defaults)
}

// The settings' flags, in the order the library documents them.
const (
	SetDSN       = "dsn"
	SetB         = "max-concurrent"
	SetQ         = "max-queue"
	SetWait      = "queue-wait"
	SetDryRun    = "dry-run"
	SetWorkloads = "workloads"
	SetAdaptive  = "adaptive"
	SetMinB      = "min-concurrent"
	SetFleet     = "fleet"
)

// The variables of the settings: those bulkhead.PolicyFromEnv and
// fleet.NameFromEnv read, and DATABASE_URL.
const (
	EnvDatabaseURL   = "DATABASE_URL"
	EnvMaxConcurrent = "BULKHEAD_MAX_CONCURRENT"
	EnvMaxQueue      = "BULKHEAD_MAX_QUEUE"
	EnvQueueWait     = "BULKHEAD_QUEUE_WAIT"
	EnvDryRun        = "BULKHEAD_DRY_RUN"
	EnvWorkloads     = "BULKHEAD_WORKLOADS"
	EnvAdaptive      = "BULKHEAD_ADAPTIVE"
	EnvMinConcurrent = "BULKHEAD_MIN_CONCURRENT"
	EnvFleet         = "BULKHEAD_FLEET"
)

// Settings are the settings, in order.
var Settings = []Setting{
	{Flag: SetDSN, Env: EnvDatabaseURL, What: "the database", Form: "postgres://... or mysql://...", Def: "embedded SQLite"},
	{Flag: SetB, Env: EnvMaxConcurrent, What: "B, operations running at once", Form: "integer ≥ 1", Def: "10"},
	{Flag: SetQ, Env: EnvMaxQueue, What: "Q, operations waiting for a permit", Form: "integer ≥ 0", Def: "10"},
	{Flag: SetWait, Env: EnvQueueWait, What: "longest wait for a permit", Form: "duration 0s to 1h, e.g. 20ms", Def: "100ms"},
	{Flag: SetDryRun, Env: EnvDryRun, What: "count what the gate would reject, reject nothing", Form: "true or false", Def: "false"},
	{Flag: SetWorkloads, Env: EnvWorkloads, What: "named budgets inside the policy, each with its priority (-100 to 100, default 0) in the policy's queue", Form: "name:B:Q:wait[:priority],... e.g. batch:2:4:50ms:-1", Def: "none"},
	{Flag: SetAdaptive, Env: EnvAdaptive, What: "move the B in force between the min concurrent and B, its ceiling, from the hold times measured", Form: "true or false", Def: "false"},
	{Flag: SetMinB, Env: EnvMinConcurrent, What: "the floor of the adaptive B, with adaptive only", Form: "integer 1 to B, with adaptive only", Def: "1"},
	{Flag: SetFleet, Env: EnvFleet, What: "a fleet budget: B and Q are the whole fleet's, shared by its instances", Form: "name of a-z, 0-9, _ and -", Def: "none"},
}

// KnownEnv are the BULKHEAD_* variables of the settings.
func KnownEnv() []string {
	var names []string
	for _, s := range Settings {
		if strings.HasPrefix(s.Env, "BULKHEAD_") {
			names = append(names, s.Env)
		}
	}
	return names
}

// OneProcess is why the one-process commands do not use --fleet.
const OneProcess = "it measures one process, which in a fleet of one holds the whole budget; `bulkhead budget --fleet` shows a live fleet"

// Command is what the help and the checks know of a command that reads
// settings.
type Command struct {
	// Unused are the settings the command does not use, and why: the
	// flag is then an error, the variable not read.
	Unused map[string]string
	// Defaults are the defaults the command's help shows where they are
	// not the table's.
	Defaults map[string]string
}

// Uses reports which settings a command uses, or nil for a command that
// reads none.
func (e *Env) Uses(cmd string) func(string) bool {
	c, ok := e.Commands[cmd]
	if !ok {
		return nil
	}
	return func(name string) bool { _, no := c.Unused[name]; return !no }
}

// helpDefault is the default a command's help shows for a setting whose
// flag has no default of its own: the command's, with its variable.
func (e *Env) helpDefault(cmd, name string) (string, bool) {
	s, ok := settingNamed(name)
	if !ok {
		return "", false
	}
	if uses := e.Uses(cmd); uses != nil && !uses(name) {
		return "none: " + cmd + " does not use it, an error", true
	}
	d := cmp.Or(e.Commands[cmd].Defaults[name], s.Def)
	if d == "false" {
		return d, true
	}
	return fmt.Sprintf("%s, or $%s", d, s.Env), true
}

// EnvHelp is the environment section of a command's help ("" for the
// program's): the variables it reads, with their flags and defaults.
func (e *Env) EnvHelp(cmd string) string {
	uses := e.Uses(cmd)
	var b strings.Builder
	b.WriteString("Environment (a flag overrides its variable; a variable overrides the default):\n")
	for _, s := range Settings {
		if uses != nil && !uses(s.Flag) {
			continue
		}
		def := cmp.Or(e.Commands[cmd].Defaults[s.Flag], s.Def)
		if cmd == "" {
			// The program's: the table's default, then the commands' own.
			var own []string
			for _, c := range slices.Sorted(maps.Keys(e.Commands)) {
				if d := e.Commands[c].Defaults[s.Flag]; d != "" && e.Uses(c)(s.Flag) {
					own = append(own, c+": "+d)
				}
			}
			if len(own) > 0 {
				def += " (" + strings.Join(own, "; ") + ")"
			}
		}
		fmt.Fprintf(&b, "  %-24s --%-15s %s; default %s\n", s.Env, s.Flag, s.Form, def)
	}
	return b.String()
}

// SettingsMatrix is the table of the settings each of cmds uses.
func (e *Env) SettingsMatrix(cmds []string) string {
	row := func(first string, cell func(cmd string) string) string {
		line := fmt.Sprintf("  %-17s", first)
		for _, c := range cmds {
			line += fmt.Sprintf(" %-8s", cell(c))
		}
		return strings.TrimRight(line, " ") + "\n"
	}
	out := row("setting", func(c string) string { return c })
	for _, st := range Settings {
		out += row("--"+st.Flag, func(c string) string {
			if e.Uses(c)(st.Flag) {
				return "x"
			}
			return "-"
		})
	}
	return out
}

// opt is a flag value that knows whether it was given and says what it
// wants when it cannot parse a value: V is its value.
type opt[T int | time.Duration | bool | string] struct {
	V   T
	set bool
}

// OptInt is an integer flag: a decimal from -2^31 to 2^31-1.
type OptInt = opt[int]

func (o *opt[T]) String() string {
	if o == nil || !o.set {
		return ""
	}
	return fmt.Sprint(o.V)
}

func (o *opt[T]) Set(s string) error {
	switch v := any(&o.V).(type) {
	case *int:
		n, err := strconv.ParseInt(s, 10, 32)
		if err != nil {
			return errors.New("want a decimal integer")
		}
		*v = int(n)
	case *time.Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return errors.New("want a Go duration with a unit, such as 20ms")
		}
		*v = d
	case *bool:
		if s != "true" && s != "false" {
			return errors.New("want true or false")
		}
		*v = s == "true"
	case *string:
		*v = s
	}
	o.set = true
	return nil
}

// IsBoolFlag lets a bool flag stand alone, as --dry-run.
func (o *opt[T]) IsBoolFlag() bool {
	_, ok := any(o.V).(bool)
	return ok
}

// typeName is the flag's type in help: none for a bool.
func (o *opt[T]) typeName() string {
	switch any(o.V).(type) {
	case int:
		return "int"
	case time.Duration:
		return "duration"
	case string:
		return "string"
	}
	return ""
}

// PolicyInput is the policy part of a command line: the settings of
// bulkhead.Policy and the fleet's name as flags, and which of them the
// command uses.
type PolicyInput struct {
	e    *Env
	fs   *flag.FlagSet
	cmd  string
	uses map[string]string // setting -> why it does nothing here
	b, q OptInt
	wait opt[time.Duration]
	dry  opt[bool]
	wl   opt[string]
	adpt opt[bool]
	minB OptInt
	flt  opt[string]
}

// AddPolicyFlags defines the policy flags on fs, whose name is the
// command's.
func (e *Env) AddPolicyFlags(fs *flag.FlagSet) *PolicyInput {
	pi := &PolicyInput{e: e, fs: fs, cmd: fs.Name(), uses: e.Commands[fs.Name()].Unused}
	fs.Var(&pi.b, SetB, "B: operations running at once")
	fs.Var(&pi.q, SetQ, "Q: operations admitted to wait for a permit")
	fs.Var(&pi.wait, SetWait, "longest wait for a permit")
	fs.Var(&pi.dry, SetDryRun, "dry run: count what the gate would reject, reject nothing")
	fs.Var(&pi.wl, SetWorkloads, "workloads, name:B:Q:wait[:priority] entries separated by commas, e.g. batch:2:4:50ms:-1 (priority -100 to 100, default 0; \"\" for none)")
	fs.Var(&pi.adpt, SetAdaptive, "adaptive: move the B in force between --min-concurrent and --max-concurrent, its ceiling, from the hold times measured")
	fs.Var(&pi.minB, SetMinB, "the floor of the adaptive B, 1 to B (with --adaptive only)")
	fs.Var(&pi.flt, SetFleet, "fleet: B and Q are those of the whole fleet of that name (see docs/fleet.md)")
	return pi
}

// used reports whether the command uses a setting.
func (pi *PolicyInput) used(name string) bool {
	_, unused := pi.uses[name]
	return !unused
}

// CheckUnused returns an error for a flag given that the command does not
// use.
func (pi *PolicyInput) CheckUnused(set map[string]bool) error {
	for _, s := range Settings {
		if why, unused := pi.uses[s.Flag]; unused && set[s.Flag] {
			return fmt.Errorf("--%s does nothing in %s: %s", s.Flag, pi.cmd, why)
		}
	}
	return nil
}

// Parse parses args into the command's flags (Env.Parse), then fails, as
// "cmd: " and CheckUnused's error, on a flag the command does not use.
func (pi *PolicyInput) Parse(args []string) (set map[string]bool, code int, done bool) {
	if set, code, done = pi.e.Parse(pi.fs, args); done {
		return nil, code, true
	}
	if err := pi.CheckUnused(set); err != nil {
		return nil, pi.e.Fail(fmt.Errorf("%s: %w", pi.cmd, err)), true
	}
	return set, ExitOK, false
}

// source says where a setting's value came from.
type source int

const (
	fromDefault source = iota
	fromEnv
	fromFlag
)

// Resolved is the policy a command line and the environment give, each
// field with where it came from.
type Resolved struct {
	P     bulkhead.Policy
	Fleet string // the fleet's name, "" for none
	src   map[string]source
	raw   map[string]string // the environment's text, for fromEnv
}

// Given reports whether a setting came from a flag or the environment.
func (r *Resolved) Given(name string) bool { return r.src[name] != fromDefault }

// Describe says where a setting came from, for errors and the policy
// command.
func (r *Resolved) Describe(name string) string {
	s, _ := settingNamed(name)
	switch r.src[name] {
	case fromFlag:
		return "from --" + name
	case fromEnv:
		return fmt.Sprintf("from %s=%s", s.Env, r.raw[name])
	}
	return fmt.Sprintf("default, %s unset", s.Env)
}

func settingNamed(name string) (Setting, bool) {
	for _, s := range Settings {
		if s.Flag == name {
			return s, true
		}
	}
	return Setting{}, false
}

// parseEnvAlone parses one policy variable of value v with the library's
// own parser, on a base policy that no value of that variable alone makes
// invalid: the policy as a whole is checked once all its fields are
// known (Check).
func parseEnvAlone(name, v string) (bulkhead.Policy, error) {
	base := bulkhead.Policy{MaxConcurrent: 1}
	switch name {
	case EnvMaxQueue:
		base.QueueWait = bulkhead.MaxQueueWait
	case EnvWorkloads:
		base.MaxConcurrent = math.MaxInt32
	case EnvMinConcurrent:
		base.MaxConcurrent, base.Adaptive = math.MaxInt32, true
	}
	p, err := bulkhead.PolicyFromEnviron(base, []string{name + "=" + v})
	if err != nil {
		// The whole-policy check adds the variables it was read from:
		// only this one counts here.
		if u := errors.Unwrap(err); u != nil {
			err = u
		}
	}
	return p, err
}

// checkFleetName checks a fleet's name by the library's rule.
func checkFleetName(name string) error { return fleet.CheckName(name) }

// checkEnv returns the library's error for the first BULKHEAD_* variable
// of the environment that is none of the settings (the test suites'
// BULKHEAD_TEST_* excepted): as bulkhead.PolicyFromEnv refuses it, so
// does every command that reads the policy from the environment.
func (e *Env) checkEnv() error {
	if e.Environ == nil {
		return nil
	}
	known := KnownEnv()
	env := e.Environ()
	slices.Sort(env)
	for _, kv := range env {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "BULKHEAD_") && !slices.Contains(known, name) {
			if _, err := bulkhead.PolicyFromEnviron(bulkhead.DefaultPolicy, []string{kv}); err != nil {
				return err
			}
		}
	}
	return nil
}

// Resolve returns the policy from the flags (set: those given), the
// environment and def, field by field: flag > environment > default. A
// variable a flag overrides is not read, so a malformed one is no error
// then. It does not check the policy as a whole: see Check.
func (pi *PolicyInput) Resolve(set map[string]bool, def bulkhead.Policy) (*Resolved, error) {
	if err := pi.CheckUnused(set); err != nil {
		return nil, err
	}
	if err := pi.e.checkEnv(); err != nil {
		return nil, err
	}
	r := &Resolved{P: def, src: map[string]source{}, raw: map[string]string{}}
	r.P.Workloads = nil
	for _, s := range Settings {
		if s.Flag == SetDSN || !pi.used(s.Flag) {
			continue
		}
		if set[s.Flag] {
			r.src[s.Flag] = fromFlag
			if err := pi.fromFlag(s.Flag, r); err != nil {
				return nil, err
			}
			continue
		}
		v, ok := pi.e.Lookup(s.Env)
		if !ok {
			continue
		}
		r.src[s.Flag], r.raw[s.Flag] = fromEnv, v
		if s.Flag == SetFleet {
			if err := checkFleetName(v); err != nil {
				return nil, fmt.Errorf("%s=%q: %w (--%s overrides it)", s.Env, v, err, s.Flag)
			}
			r.Fleet = v
			continue
		}
		p, err := parseEnvAlone(s.Env, v)
		if err != nil {
			return nil, fmt.Errorf("%w (--%s overrides it)", err, s.Flag)
		}
		copyField[s.Flag](&r.P, &p)
	}
	return r, nil
}

// copyField copies the field of each policy setting from src to dst.
var copyField = map[string]func(dst, src *bulkhead.Policy){
	SetB:         func(dst, src *bulkhead.Policy) { dst.MaxConcurrent = src.MaxConcurrent },
	SetQ:         func(dst, src *bulkhead.Policy) { dst.MaxQueue = src.MaxQueue },
	SetWait:      func(dst, src *bulkhead.Policy) { dst.QueueWait = src.QueueWait },
	SetDryRun:    func(dst, src *bulkhead.Policy) { dst.DryRun = src.DryRun },
	SetWorkloads: func(dst, src *bulkhead.Policy) { dst.Workloads = src.Workloads },
	SetAdaptive:  func(dst, src *bulkhead.Policy) { dst.Adaptive = src.Adaptive },
	SetMinB:      func(dst, src *bulkhead.Policy) { dst.MinConcurrent = src.MinConcurrent },
}

// ResolveChecked is Resolve, then check (Resolved.Check or
// Resolved.CheckAdaptive) on the policy it gives.
func (pi *PolicyInput) ResolveChecked(set map[string]bool, def bulkhead.Policy, check func(*Resolved) error) (*Resolved, error) {
	r, err := pi.Resolve(set, def)
	if err == nil {
		err = check(r)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

// fromFlag checks a policy flag's value and sets it in r.
func (pi *PolicyInput) fromFlag(name string, r *Resolved) error {
	p := &r.P
	switch name {
	case SetB:
		p.MaxConcurrent = pi.b.V
		return atLeast(name, pi.b.V, 1)
	case SetQ:
		p.MaxQueue = pi.q.V
		return atLeast(name, pi.q.V, 0)
	case SetWait:
		if pi.wait.V < 0 || pi.wait.V > bulkhead.MaxQueueWait {
			return fmt.Errorf("--queue-wait is %v, want 0s to %v", pi.wait.V, bulkhead.MaxQueueWait)
		}
		p.QueueWait = pi.wait.V
	case SetDryRun:
		p.DryRun = pi.dry.V
	case SetWorkloads:
		// The library's parser, on the flag's text; its message then
		// names the flag instead of the variable.
		w, err := parseEnvAlone(EnvWorkloads, pi.wl.V)
		if err != nil {
			return errors.New(strings.Replace(strings.TrimPrefix(err.Error(), "bulkhead: "), EnvWorkloads, "--workloads", 1))
		}
		p.Workloads = w.Workloads
	case SetAdaptive:
		p.Adaptive = pi.adpt.V
	case SetMinB:
		p.MinConcurrent = pi.minB.V
		return atLeast(name, pi.minB.V, 1)
	case SetFleet:
		if err := checkFleetName(pi.flt.V); err != nil {
			return fmt.Errorf("--fleet: %w", err)
		}
		r.Fleet = pi.flt.V
	}
	return nil
}

// atLeast checks the value v of an integer flag against its least.
func atLeast(flag string, v, least int) error {
	if v < least {
		return fmt.Errorf("--%s is %d, want an integer from %d to %d", flag, v, least, math.MaxInt32)
	}
	return nil
}

// Check validates the policy as a whole; its error names where each
// field came from.
func (r *Resolved) Check() error { return r.check(r.P, true) }

// CheckAdaptive validates Adaptive and MinConcurrent against B alone, for
// a command that uses B but not the queue (budget); its error names where
// each field came from.
func (r *Resolved) CheckAdaptive() error {
	p := bulkhead.Policy{MaxConcurrent: r.P.MaxConcurrent, Adaptive: r.P.Adaptive, MinConcurrent: r.P.MinConcurrent}
	return r.check(p, false)
}

// check validates p, the policy of r or part of it (queue: with its Q
// and wait).
func (r *Resolved) check(p bulkhead.Policy, queue bool) error {
	err := p.Validate()
	if err == nil {
		return nil
	}
	parts := []string{fmt.Sprintf("B=%d %s", p.MaxConcurrent, r.Describe(SetB))}
	if queue {
		parts = append(parts,
			fmt.Sprintf("Q=%d %s", p.MaxQueue, r.Describe(SetQ)),
			fmt.Sprintf("wait=%v %s", p.QueueWait, r.Describe(SetWait)))
	}
	if len(p.Workloads) > 0 {
		parts = append(parts, "workloads "+r.Describe(SetWorkloads))
	}
	if p.Adaptive || p.MinConcurrent > 0 {
		parts = append(parts,
			fmt.Sprintf("adaptive=%v %s", p.Adaptive, r.Describe(SetAdaptive)),
			fmt.Sprintf("min=%d %s", p.MinConcurrent, r.Describe(SetMinB)))
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(parts, ", "))
}

// WorkloadNames lists the workloads of p, sorted.
func WorkloadNames(p bulkhead.Policy) []string {
	names := make([]string, 0, len(p.Workloads))
	for n := range p.Workloads {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// CheckWorkload checks --workload against the policy's workloads: a name
// it lists, and workloads given by flag only with --workload (they would
// do nothing: no operation would name them).
func CheckWorkload(r *Resolved, workload string, set map[string]bool) error {
	names := WorkloadNames(r.P)
	switch {
	case workload != "" && len(names) == 0:
		return fmt.Errorf("--workload %q names no workload: the policy has none; want --workloads or %s with it", workload, EnvWorkloads)
	case workload != "" && r.P.Workloads[workload] == (bulkhead.Workload{}):
		return fmt.Errorf("--workload %q is not a workload of the policy; want one of %s", workload, strings.Join(names, ", "))
	case workload == "" && set[SetWorkloads] && len(names) > 0:
		return fmt.Errorf("--workloads does nothing without --workload: no operation would name a workload; want --workload NAME too")
	}
	return nil
}

// PolicySetup describes the gate of a run: its policy, dry-run and the
// workload its operations name, with its priority when not 0. It does
// not say Adaptive: AdaptiveSetup does.
func PolicySetup(p bulkhead.Policy, workload string) string {
	s := fmt.Sprintf("B=%d Q=%d wait=%v", p.MaxConcurrent, p.MaxQueue, p.QueueWait)
	if workload != "" {
		s += " workload " + workload + " " + WorkloadSetup(p.Workloads[workload], false)
	}
	if p.DryRun {
		s += " dry-run"
	}
	return s
}

// WorkloadSetup describes a workload's budget: B, Q, wait and its
// priority, always or only when not 0.
func WorkloadSetup(w bulkhead.Workload, priority bool) string {
	s := fmt.Sprintf("B=%d Q=%d wait=%v", w.MaxConcurrent, w.MaxQueue, w.QueueWait)
	if priority || w.Priority != 0 {
		s += fmt.Sprintf(" priority=%d", w.Priority)
	}
	return s
}

// MinConcurrent is the floor of p's adaptive B (Policy.MinConcurrent, 0
// meaning 1), or 0 without Adaptive.
func MinConcurrent(p bulkhead.Policy) int {
	if !p.Adaptive {
		return 0
	}
	return max(1, p.MinConcurrent)
}

// AdaptiveSetup is what PolicySetup's text gets under Adaptive: ",
// adaptive from the floor to B", or "".
func AdaptiveSetup(p bulkhead.Policy) string {
	if !p.Adaptive {
		return ""
	}
	return fmt.Sprintf(", adaptive from %d to %d", MinConcurrent(p), p.MaxConcurrent)
}
