// Command bulkhead demonstrates and measures the bulkhead gate, and checks
// a PostgreSQL connection budget.
//
//	bulkhead demo     the gate rejects the overload, the held transaction commits
//	bulkhead load     N clients against the gate (and, with --baseline, without it)
//	bulkhead overload open-loop arrivals at 1, 3, 6 × capacity: plain pool, pool as semaphore, gate
//	bulkhead fleet    several processes of one service against one budget T: static gates, a fleet budget, PgBouncer
//	bulkhead budget   instances × connections + other ≤ max_connections − reserved
//	bulkhead policy   the policy that the flags and BULKHEAD_* in the environment give
//	bulkhead version  the tool's version and the Go it was built with
//
// Exit status: 0 ok, 1 a finding (budget: over budget), 2 an error (usage,
// input, unreachable server), 130 interrupted by Ctrl-C (143 by SIGTERM)
// after printing what was measured.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"
)

// Exit codes.
const (
	exitOK          = 0
	exitFinding     = 1
	exitError       = 2
	exitInterrupted = 130 // 128 + SIGINT, as a shell reports Ctrl-C
)

func main() {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	var got os.Signal
	gotSig := make(chan struct{})
	go func() {
		// After the first signal the commands stop and report; a second
		// one ends the process the usual way.
		got = <-sigs
		close(gotSig)
		signal.Reset(os.Interrupt, syscall.SIGTERM)
		cancel()
	}()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if code == exitInterrupted {
		<-gotSig
		if got == syscall.SIGTERM {
			code = 128 + int(syscall.SIGTERM)
		}
	}
	os.Exit(code)
}

// run is the whole command: args without the program name, the process
// environment, output on stdout and stderr; it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{stdin: os.Stdin, stdout: stdout, stderr: stderr, lookup: os.LookupEnv, environ: os.Environ, isTerminal: isTerminal}
	return e.run(ctx, args)
}

// env is what a command sees of the outside world; tests give their own.
type env struct {
	stdin          io.Reader // read by the fleet's members alone
	stdout, stderr io.Writer
	lookup         func(string) (string, bool)
	environ        func() []string
	isTerminal     func(io.Writer) bool
	self           func() (string, error) // this program, for the fleet's members; nil: os.Executable
}

const topUsageHead = `bulkhead: a database/sql gate that caps database work (B), queues a little (Q), rejects the rest.

Usage:
  bulkhead demo   [--dsn URL]      the demonstration: overload rejected, held transaction commits
  bulkhead load   [flags]          N clients through the gate (--baseline: also without it)
  bulkhead overload [flags]        open-loop arrivals at multiples of capacity: plain, semaphore, gate
  bulkhead fleet --dsn URL ...     processes of one service sharing T: static gates, fleet budget, PgBouncer
  bulkhead budget --dsn URL ...    connection budget of a PostgreSQL server
  bulkhead policy [flags]          the policy that the flags and BULKHEAD_* variables give
  bulkhead version                 the tool's version and the Go it was built with

Run "bulkhead COMMAND --help" for a command's flags and examples.

`

const topUsageTail = `
Every command reads a setting the same way: its flag, else its variable,
else the default. A flag a command does not use is an error; that
command does not read its variable. A BULKHEAD_* variable that nothing
reads gets a warning on stderr (BULKHEAD_TEST_* belong to the test suites).

%s
Exit status: 0 ok, 1 a finding (over budget), 2 an error (usage, input, server),
130 interrupted by Ctrl-C (143 by SIGTERM), after printing what was measured.
`

func topUsage() string {
	return topUsageHead + envHelp(func(string) bool { return true }) + fmt.Sprintf(topUsageTail, settingsMatrix())
}

// settingsMatrix is the table of the settings each command uses.
func settingsMatrix() string {
	cmds := []string{"demo", "load", "overload", "fleet", "budget", "policy"}
	row := func(first string, cell func(cmd string) string) string {
		line := fmt.Sprintf("  %-17s", first)
		for _, c := range cmds {
			line += fmt.Sprintf(" %-8s", cell(c))
		}
		return strings.TrimRight(line, " ") + "\n"
	}
	out := row("setting", func(c string) string { return c })
	for _, st := range settings {
		out += row("--"+st.flag, func(c string) string {
			if commandUses(c)(st.flag) {
				return "x"
			}
			return "-"
		})
	}
	return out
}

func (e *env) run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, topUsage())
		return exitError
	}
	cmd, rest := args[0], args[1:]
	commands := map[string]func(context.Context, []string) int{
		"demo": e.demo, "load": e.load, "overload": e.overload, "fleet": e.fleet, "budget": e.budget, "policy": e.policy, "version": e.version,
	}
	if cmd == fleetMemberCmd {
		// Hidden: a member of "bulkhead fleet", which warned already.
		return e.fleetMember(ctx, rest)
	}
	if f, ok := commands[cmd]; ok {
		if cmd != "version" {
			e.warnUnknownEnv()
		}
		return f(ctx, rest)
	}
	switch cmd {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(e.stdout, topUsage())
		return exitOK
	case "-version", "--version":
		return e.version(ctx, nil)
	}
	return e.fail(fmt.Errorf("unknown command %q; want demo, load, overload, fleet, budget, policy or version (bulkhead --help)", cmd))
}

const versionUsage = `Usage: bulkhead version

Prints the tool's module version ("(devel)" when built from a work tree),
the version control revision it was built from when the build recorded
one, and the Go version it was built with.
`

func (e *env) version(_ context.Context, args []string) int {
	fs := e.newFlagSet("version", versionUsage, "  bulkhead version\n  bulkhead --version\n")
	if code, done := e.parseFlags(fs, args); done {
		return code
	}
	fmt.Fprintln(e.stdout, versionLine(debug.ReadBuildInfo()))
	return exitOK
}

// versionLine is the version command's output: module version, revision
// (with "+modified" for a dirty tree) when recorded, and Go version.
func versionLine(bi *debug.BuildInfo, ok bool) string {
	if !ok || bi == nil {
		return "bulkhead (unknown version: no build information)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	line := "bulkhead " + v
	var rev, modified, when string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		case "vcs.time":
			when = s.Value
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if modified == "true" {
			rev += "+modified"
		}
		line += " revision " + rev
		if when != "" {
			line += " (" + when + ")"
		}
	}
	return line + " " + bi.GoVersion
}

// interrupted is the exit code of a command whose run ctx ended: 130
// after Ctrl-C; what it measured has been printed.
func interrupted(ctx context.Context, code int) int {
	if ctx.Err() != nil && code == exitOK {
		return exitInterrupted
	}
	return code
}

// fail prints err as one line on stderr, prefixed "bulkhead:" once, and
// returns the error exit code.
func (e *env) fail(err error) int {
	fmt.Fprintln(e.stderr, oneLine(err))
	return exitError
}

// oneLine renders err as a single line starting with "bulkhead: ", the
// prefix only once.
func oneLine(err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	// Wrapped library errors carry the prefix too: keep it once, in front.
	return "bulkhead: " + strings.ReplaceAll(msg, "bulkhead: ", "")
}

// newFlagSet returns a flag set for a subcommand. Its errors are reported
// by parseFlags; --help prints usage (synopsis, flags with their real
// defaults, the environment the command reads, examples) on stdout.
func (e *env) newFlagSet(name, synopsis, examples string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(e.stdout, "%s\n\nFlags:\n", strings.TrimRight(synopsis, "\n"))
		n := 0
		fs.VisitAll(func(f *flag.Flag) {
			n++
			fmt.Fprint(e.stdout, flagHelp(name, f))
		})
		if n == 0 {
			fmt.Fprintln(e.stdout, "  none but --help")
		}
		if uses := commandUses(name); uses != nil {
			fmt.Fprintf(e.stdout, "\n%s", envHelp(uses))
		}
		fmt.Fprintf(e.stdout, "\nExamples:\n%s", examples)
	}
	return fs
}

// flagHelp is one flag's entry in a command's help: name, type, usage and
// the default in force when neither the flag nor its variable is given.
func flagHelp(cmd string, f *flag.Flag) string {
	typ, usage := flag.UnquoteUsage(f)
	if t, ok := f.Value.(interface{ typeName() string }); ok {
		typ = t.typeName()
	}
	head := "  --" + f.Name
	if typ != "" {
		head += " " + typ
	}
	def := f.DefValue
	if strings.Contains(usage, "default") {
		def = "" // the usage says it
	}
	switch d, ok := helpDefault(cmd, f.Name); {
	case ok && d == "false":
		def = ""
	case ok:
		def = " (default " + d + ")"
	case def == "" || def == "false":
		def = ""
	case typ == "string":
		def = fmt.Sprintf(" (default %q)", def)
	default:
		def = " (default " + def + ")"
	}
	return fmt.Sprintf("%s\n    \t%s%s\n", head, usage, def)
}

// helpDefault is the default a command's help shows for a setting whose
// flag has no default of its own: the command's, with its variable.
func helpDefault(cmd, name string) (string, bool) {
	var s *setting
	for i := range settings {
		if settings[i].flag == name {
			s = &settings[i]
		}
	}
	if s == nil {
		return "", false
	}
	d := map[string]string{setB: "10", setQ: "10", setWait: "100ms", setDryRun: "false", setWorkloads: "none"}[name]
	if cmd == "fleet" {
		switch name {
		case setB:
			d = "8, T: the service's total"
		case setQ:
			d = "max(B, ⌊B/S·wait⌋) per gate, by the rule"
		case setWait:
			d = "deadline − 2·S, by the rule"
		}
	}
	if cmd == "overload" {
		switch name {
		case setB:
			d = fmt.Sprintf("the number of CPUs, %d here", numCPU())
		case setQ:
			d = "max(B, ⌊C·wait⌋), by the rule"
		case setWait:
			d = "deadline − 2·B/C, by the rule"
		}
	}
	if name == setDSN {
		d = "embedded SQLite"
		if cmd == "budget" || cmd == "fleet" {
			d = "none: required"
		}
	}
	if uses := commandUses(cmd); uses != nil && !uses(name) {
		return "none: " + cmd + " does not use it, an error", true
	}
	if d == "false" {
		return d, true
	}
	return fmt.Sprintf("%s, or $%s", d, s.env), true
}

// commandUses reports which settings a command uses, or nil for a command
// that reads none.
func commandUses(cmd string) func(string) bool {
	unused, ok := unusedSettings[cmd]
	if !ok {
		return nil
	}
	return func(name string) bool { _, no := unused[name]; return !no }
}

// unusedSettings are, per command, the settings it does not use and why:
// the flag is then an error, the variable not read.
var unusedSettings = map[string]map[string]string{
	"demo": {
		setB: demoFixed, setQ: demoFixed, setWait: demoFixed, setDryRun: demoFixed, setWorkloads: demoFixed, setFleet: demoFixed,
	},
	"load":     {setFleet: oneProcess},
	"overload": {setFleet: oneProcess},
	"fleet": {
		setDryRun:    "the experiment measures what each arm enforces",
		setWorkloads: "the experiment's requests are of one kind",
		setFleet:     "the experiment names the fleet of its fleet arm itself, one per run",
	},
	"budget": {
		setWait:      "the budget counts connections, B+Q; the queue wait does not change them",
		setWorkloads: "workloads share the policy's B+Q; they do not change the connections",
	},
	"policy": {setDSN: "the policy command connects to no database"},
}

const oneProcess = "it measures one process, which in a fleet of one holds the whole budget; `bulkhead budget --fleet` shows a live fleet"

const demoFixed = "the demonstration's policy is fixed (B=1, Q=0, no wait) so that the second operation is rejected"

// flagErr matches the flag package's message for a value it could not
// set.
var flagErr = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-([^:]+): (.*)$`)

// parseFlags parses args into fs. It returns done=true with the exit code
// when the command must stop: --help (0) or a bad flag (2, one line on
// stderr naming the flag, its value and what it wants).
func (e *env) parseFlags(fs *flag.FlagSet, args []string) (code int, done bool) {
	usage := fs.Usage
	fs.Usage = func() {} // the flag package calls it on every error
	err := fs.Parse(args)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		usage()
		return exitOK, true
	}
	name := fs.Name()
	if err != nil {
		msg := err.Error()
		if m := flagErr.FindStringSubmatch(msg); m != nil {
			msg = fmt.Sprintf("--%s %q: %s", m[2], m[1], wantOf(fs.Lookup(m[2]), m[3]))
		} else if rest, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
			msg = "unknown flag --" + strings.TrimPrefix(rest, "-")
		}
		return e.fail(fmt.Errorf("%s: %s (see bulkhead %s --help)", name, msg, name)), true
	}
	if fs.NArg() > 0 {
		return e.fail(fmt.Errorf("%s: unexpected argument %q; flags only (see bulkhead %s --help)", name, fs.Arg(0), name)), true
	}
	return exitOK, false
}

// wantOf says what a flag wants, from its type: the flag package's own
// words ("parse error") do not.
func wantOf(f *flag.Flag, said string) string {
	if f == nil {
		return said
	}
	if g, ok := f.Value.(flag.Getter); ok {
		switch g.Get().(type) {
		case int, int64:
			return "want an integer"
		case uint, uint64:
			return "want a non-negative integer"
		case float64:
			return "want a number"
		case time.Duration:
			return "want a Go duration with a unit, such as 20ms"
		case bool:
			return "want true or false"
		}
	}
	if strings.HasPrefix(said, "want ") {
		return said
	}
	return "want " + said
}

// flagsSet returns the names of the flags given on the command line.
func flagsSet(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// terminalWidth returns the width of the terminal w is, or 0.
func terminalWidth(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok {
		return 0
	}
	width, _, err := term.GetSize(int(f.Fd()))
	if err != nil {
		return 0
	}
	return width
}
