// Package cli is the command-line machinery of the bulkhead tool
// (cmd/bulkhead), shared with the experiments (module experiments): the
// environment a command sees, its flags and help, the policy settings
// (flag > BULKHEAD_* variable > default), the database a DSN names, the
// pg_stat_activity reader, the measurements' outcomes and percentiles,
// and the one ending of the measuring commands (table, chart, JSON).
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"
)

// Exit codes.
const (
	ExitOK          = 0
	ExitFinding     = 1
	ExitError       = 2
	ExitInterrupted = 130 // 128 + SIGINT, as a shell reports Ctrl-C
)

// Env is what a command sees of the outside world; tests give their own.
type Env struct {
	Name           string    // the program's, in the help's hints: "bulkhead"
	Stdin          io.Reader // read by the fleet experiment's members alone
	Stdout, Stderr io.Writer
	Lookup         func(string) (string, bool)
	Environ        func() []string
	IsTerminal     func(io.Writer) bool
	Self           func() (string, error) // this program, for the fleet's members; nil: os.Executable
	// Commands are the program's commands that read settings, for their
	// help and their checks.
	Commands map[string]Command
}

// Main runs a program: run gets the process's environment and the
// arguments without the program name, and returns the exit code. After
// the first SIGINT or SIGTERM, run's ctx ends and the commands stop and
// report; a second one ends the process the usual way. An interrupted
// command exits 130, or 143 after SIGTERM.
func Main(name string, commands map[string]Command, run func(ctx context.Context, e *Env, args []string) int) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	var got os.Signal
	gotSig := make(chan struct{})
	go func() {
		got = <-sigs
		close(gotSig)
		signal.Reset(os.Interrupt, syscall.SIGTERM)
		cancel()
	}()
	e := &Env{Name: name, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Lookup: os.LookupEnv, Environ: os.Environ,
		IsTerminal: IsTerminal, Commands: commands}
	code := run(ctx, e, os.Args[1:])
	if code == ExitInterrupted {
		<-gotSig
		if got == syscall.SIGTERM {
			code = 128 + int(syscall.SIGTERM)
		}
	}
	os.Exit(code)
}

// Interrupted is the exit code of a command whose run ctx ended: 130
// after Ctrl-C; what it measured has been printed.
func Interrupted(ctx context.Context, code int) int {
	if ctx.Err() != nil && code == ExitOK {
		return ExitInterrupted
	}
	return code
}

// Fail prints err as one line on stderr, prefixed "bulkhead:" once, and
// returns the error exit code.
func (e *Env) Fail(err error) int {
	fmt.Fprintln(e.Stderr, OneLine(err))
	return ExitError
}

// OneLine renders err as a single line starting with "bulkhead: ", the
// prefix only once.
func OneLine(err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	// Wrapped library errors carry the prefix too: keep it once, in front.
	return "bulkhead: " + strings.ReplaceAll(msg, "bulkhead: ", "")
}

// NewFlagSet returns a flag set for a subcommand. Its errors are reported
// by ParseFlags; --help prints usage (synopsis, flags with their real
// defaults, the environment the command reads, examples) on stdout.
func (e *Env) NewFlagSet(name, synopsis, examples string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(e.Stdout, "%s\n\nFlags:\n", strings.TrimRight(synopsis, "\n"))
		n := 0
		fs.VisitAll(func(f *flag.Flag) {
			n++
			fmt.Fprint(e.Stdout, e.flagHelp(name, f))
		})
		if n == 0 {
			fmt.Fprintln(e.Stdout, "  none but --help")
		}
		if e.Uses(name) != nil {
			fmt.Fprintf(e.Stdout, "\n%s", e.EnvHelp(name))
		}
		fmt.Fprintf(e.Stdout, "\nExamples:\n%s", examples)
	}
	return fs
}

// flagHelp is one flag's entry in a command's help: name, type, usage and
// the default in force when neither the flag nor its variable is given.
func (e *Env) flagHelp(cmd string, f *flag.Flag) string {
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
	switch d, ok := e.helpDefault(cmd, f.Name); {
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

// flagErr matches the flag package's message for a value it could not
// set.
var flagErr = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-([^:]+): (.*)$`)

// ParseFlags parses args into fs. It returns done=true with the exit code
// when the command must stop: --help (0) or a bad flag (2, one line on
// stderr naming the flag, its value and what it wants).
func (e *Env) ParseFlags(fs *flag.FlagSet, args []string) (code int, done bool) {
	usage := fs.Usage
	fs.Usage = func() {} // the flag package calls it on every error
	err := fs.Parse(args)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		usage()
		return ExitOK, true
	}
	name := fs.Name()
	if err != nil {
		msg := err.Error()
		if m := flagErr.FindStringSubmatch(msg); m != nil {
			msg = fmt.Sprintf("--%s %q: %s", m[2], m[1], wantOf(fs.Lookup(m[2]), m[3]))
		} else if rest, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
			msg = "unknown flag --" + strings.TrimPrefix(rest, "-")
		}
		return e.Fail(fmt.Errorf("%s: %s (see %s %s --help)", name, msg, e.Name, name)), true
	}
	if fs.NArg() > 0 {
		return e.Fail(fmt.Errorf("%s: unexpected argument %q; flags only (see %s %s --help)", name, fs.Arg(0), e.Name, name)), true
	}
	return ExitOK, false
}

// Parse is ParseFlags for a command that parses into a configuration: it
// also returns the flags given.
func (e *Env) Parse(fs *flag.FlagSet, args []string) (set map[string]bool, code int, done bool) {
	if code, done := e.ParseFlags(fs, args); done {
		return nil, code, true
	}
	return FlagsSet(fs), ExitOK, false
}

// Failer returns the error return of a command's parser (a *T
// configuration, the exit code, done): the error, "cmd: " and format
// filled, printed by Fail.
func Failer[T any](e *Env, cmd string) func(format string, a ...any) (*T, int, bool) {
	return func(format string, a ...any) (*T, int, bool) {
		return nil, e.Fail(fmt.Errorf(cmd+": "+format, a...)), true
	}
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

// FlagsSet returns the names of the flags given on the command line.
func FlagsSet(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// TerminalWidth returns the width of the terminal w is, or 0.
func TerminalWidth(w io.Writer) int {
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

// Outputs are the --json and --chart flags of a measuring command.
type Outputs struct {
	JSON  string // "" for none, "-" for stdout
	Chart string // an .svg file, "" for none
}

// AddOutputFlags defines --json and --chart on fs; what says what the
// chart shows.
func AddOutputFlags(fs *flag.FlagSet, what string) *Outputs {
	o := &Outputs{}
	fs.StringVar(&o.Chart, "chart", "", "write a chart of "+what+" to this .svg file (SVG only)")
	fs.StringVar(&o.JSON, "json", "", "write the results as JSON to this file (- for stdout; the table then goes to stderr)")
	return o
}

// Report ends the measuring commands: it prints the table (on stderr
// when the JSON goes to stdout), draws the chart to o.Chart if given and
// something was measured, and writes v as JSON to o.JSON if given.
func (e *Env) Report(ctx context.Context, cmd string, o Outputs, measured bool, table func(io.Writer), draw func(path string) error, v any) int {
	out := e.Stdout
	if o.JSON == "-" {
		out = e.Stderr
	}
	table(out)
	if o.Chart != "" && measured {
		if err := draw(o.Chart); err != nil {
			return e.Fail(fmt.Errorf("%s: --chart %s: %w", cmd, o.Chart, err))
		}
		fmt.Fprintf(out, "chart written to %s\n", o.Chart)
	}
	if o.JSON != "" {
		if err := writeJSON(o.JSON, e.Stdout, v); err != nil {
			return e.Fail(fmt.Errorf("%s: --json %s: %w", cmd, o.JSON, err))
		}
	}
	return Interrupted(ctx, ExitOK)
}

// writeJSON writes v as indented JSON to the file path, or to stdout for
// "-".
func writeJSON(path string, stdout io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if path == "-" {
		_, err = stdout.Write(b)
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// Check checks the --json and --chart values before a run, so that it
// does not end with nowhere to write its results: a file in a directory
// that exists ("-" for stdout), and an .svg chart (the charts are SVG
// only: a .png name is refused rather than written as something else).
func (o Outputs) Check() error {
	jsonOut, chart := o.JSON, o.Chart
	if jsonOut != "" && jsonOut != "-" {
		if err := checkDir(jsonOut); err != nil {
			return fmt.Errorf("--json %q: %v", jsonOut, err)
		}
	}
	if chart == "" {
		return nil
	}
	switch ext := strings.ToLower(filepath.Ext(chart)); ext {
	case ".svg":
	case ".png":
		return fmt.Errorf("--chart %q: PNG is not supported, want a file name ending in .svg (charts are SVG only)", chart)
	default:
		return fmt.Errorf("--chart %q has extension %q, want a file name ending in .svg", chart, ext)
	}
	if err := checkDir(chart); err != nil {
		return fmt.Errorf("--chart %q: %v", chart, err)
	}
	return nil
}

// checkDir reports whether the directory of path exists.
func checkDir(path string) error {
	dir := filepath.Dir(path)
	st, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("directory %s does not exist", dir)
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	return nil
}
