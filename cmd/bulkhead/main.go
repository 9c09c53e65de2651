// Command bulkhead demonstrates the bulkhead gate, measures it under
// load, and checks a PostgreSQL connection budget.
//
//	bulkhead demo     the gate rejects the overload, the held transaction commits
//	bulkhead load     N clients against the gate (and, with --baseline, without it)
//	bulkhead budget   the connections that can be open ≤ max_connections − reserved; --fleet: the live fleet
//	bulkhead policy   the policy that the flags and BULKHEAD_* in the environment give
//	bulkhead version  the tool's version and the Go it was built with
//
// The experiments (open-loop overload, fleets of processes) are the
// program of the module experiments.
//
// Exit status: 0 ok, 1 a finding (budget: over budget), 2 an error (usage,
// input, unreachable server), 130 interrupted by Ctrl-C (143 by SIGTERM)
// after printing what was measured.
package main

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
)

func main() { cli.Main("bulkhead", commands, run) }

// env is what a command sees of the outside world (cli.Env), with the
// commands as its methods.
type env struct{ *cli.Env }

// run is the whole program: args without the program name.
func run(ctx context.Context, e *cli.Env, args []string) int {
	return (&env{e}).run(ctx, args)
}

// commands are the commands that read settings, and those they do not
// use: the flag is then an error, the variable not read.
var commands = map[string]cli.Command{
	"demo": {Unused: map[string]string{
		cli.SetB: demoFixed, cli.SetQ: demoFixed, cli.SetWait: demoFixed, cli.SetDryRun: demoFixed, cli.SetWorkloads: demoFixed,
		cli.SetAdaptive: demoFixed, cli.SetMinB: demoFixed, cli.SetFleet: demoFixed,
	}},
	"load": {Unused: map[string]string{cli.SetFleet: cli.OneProcess}},
	"budget": {Unused: map[string]string{
		cli.SetWait:      "the budget counts connections; the queue wait does not change them",
		cli.SetWorkloads: "workloads share the policy's B and Q; they do not change the connections",
	}, Defaults: map[string]string{cli.SetDSN: "none: required"}},
	"policy": {Unused: map[string]string{cli.SetDSN: "the policy command connects to no database"}},
}

const demoFixed = "the demonstration's policy is fixed (B=1, Q=0, no wait) so that the second operation is rejected"

const topUsageHead = `bulkhead: a database/sql gate that caps database work (B), queues a little (Q), rejects the rest.

Usage:
  bulkhead demo   [--dsn URL]      the demonstration: overload rejected, held transaction commits
  bulkhead load   [flags]          N clients through the gate (--baseline: also without it)
  bulkhead budget --dsn URL ...    connection budget of a PostgreSQL server (--fleet NAME: a live fleet)
  bulkhead policy [flags]          the policy that the flags and BULKHEAD_* variables give
  bulkhead version                 the tool's version and the Go it was built with

Run "bulkhead COMMAND --help" for a command's flags and examples. The
experiments (overload, fleet) are "go run ./experiments".

`

const topUsageTail = `
Every command reads a setting the same way: its flag, else its variable,
else the default. A flag a command does not use is an error; that
command does not read its variable. As in bulkhead.PolicyFromEnv, a
BULKHEAD_* variable that no setting names is an error in the commands
that read the policy (BULKHEAD_TEST_* belong to the test suites).

%s
Exit status: 0 ok, 1 a finding (over budget), 2 an error (usage, input, server),
130 interrupted by Ctrl-C (143 by SIGTERM), after printing what was measured.
`

func (e *env) topUsage() string {
	return topUsageHead + e.EnvHelp("") + fmt.Sprintf(topUsageTail, e.SettingsMatrix([]string{"demo", "load", "budget", "policy"}))
}

func (e *env) run(ctx context.Context, args []string) int {
	if len(args) == 0 {
		fmt.Fprint(e.Stderr, e.topUsage())
		return cli.ExitError
	}
	cmd, rest := args[0], args[1:]
	commands := map[string]func(context.Context, []string) int{
		"demo": e.demo, "load": e.load, "budget": e.budget, "policy": e.policy, "version": e.version,
	}
	if f, ok := commands[cmd]; ok {
		return f(ctx, rest)
	}
	switch cmd {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(e.Stdout, e.topUsage())
		return cli.ExitOK
	case "-version", "--version":
		return e.version(ctx, nil)
	case "overload", "fleet":
		return e.Fail(fmt.Errorf("%s is not a command of this tool: it is an experiment, go run ./experiments %s (from the repository's root)", cmd, cmd))
	}
	return e.Fail(fmt.Errorf("unknown command %q; want demo, load, budget, policy or version (bulkhead --help)", cmd))
}

const versionUsage = `Usage: bulkhead version

Prints the tool's module version ("(devel)" when built from a work tree),
the version control revision it was built from when the build recorded
one, and the Go version it was built with.
`

func (e *env) version(_ context.Context, args []string) int {
	fs := e.NewFlagSet("version", versionUsage, "  bulkhead version\n  bulkhead --version\n")
	if code, done := e.ParseFlags(fs, args); done {
		return code
	}
	fmt.Fprintln(e.Stdout, versionLine(debug.ReadBuildInfo()))
	return cli.ExitOK
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
