// Package clitest holds what the tests of the bulkhead tool and of the
// experiments share: running a program's commands on a synthetic
// environment, the real-server URLs, and the checks of their outputs.
package clitest

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/cli"
	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/svg"
)

// Servers of the real-server tests; the variables override the defaults.
const (
	EnvTestPostgres = "BULKHEAD_TEST_DATABASE_URL"
	EnvTestMySQL    = "BULKHEAD_TEST_MYSQL_URL"
)

// PostgresURL returns the PostgreSQL server for real-server tests. Under
// -short the test is skipped.
func PostgresURL(t *testing.T) string {
	t.Helper()
	return serverURL(t, "PostgreSQL", EnvTestPostgres, "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

// MySQLURL returns the MariaDB/MySQL server for real-server tests. Under
// -short the test is skipped.
func MySQLURL(t *testing.T) string {
	t.Helper()
	return serverURL(t, "MariaDB", EnvTestMySQL, "mysql://root@127.0.0.1:3306/test")
}

// serverURL returns $env, else def; under -short it skips the test, which
// needs the server named.
func serverURL(t *testing.T, server, env, def string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs " + server + "; skipped under -short")
	}
	return cmp.Or(os.Getenv(env), def)
}

// Result is what one command run printed and returned.
type Result struct {
	Code           int
	Stdout, Stderr string
}

// Program is a program's commands and its run function, as cli.Main
// takes them.
type Program struct {
	Name     string
	Commands map[string]cli.Command
	Run      func(ctx context.Context, e *cli.Env, args []string) int
}

// Env returns an environment whose outputs are buffers, whose
// environment is vars alone (the process's is not read), and whose
// stderr is a terminal or not.
func (p Program) Env(vars map[string]string, tty bool) (e *cli.Env, stdout, stderr *bytes.Buffer) {
	stdout, stderr = new(bytes.Buffer), new(bytes.Buffer)
	return &cli.Env{
		Name:   p.Name,
		Stdout: stdout, Stderr: stderr,
		Lookup: func(k string) (string, bool) { v, ok := vars[k]; return v, ok },
		Environ: func() []string {
			var kv []string
			for k, v := range vars {
				kv = append(kv, k+"="+v)
			}
			return kv
		},
		IsTerminal: func(io.Writer) bool { return tty },
		Commands:   p.Commands,
	}, stdout, stderr
}

// Cmd runs the program with args on the environment vars, stderr not a
// terminal.
func (p Program) Cmd(t *testing.T, vars map[string]string, args ...string) Result {
	t.Helper()
	return p.CmdTerm(t, context.Background(), vars, nil, false, args...)
}

// CmdTerm is Cmd with a context, stderr also written to stderr if not
// nil, and a terminal or not.
func (p Program) CmdTerm(t *testing.T, ctx context.Context, vars map[string]string, stderr io.Writer, tty bool, args ...string) Result {
	t.Helper()
	e, out, errb := p.Env(vars, tty)
	if stderr != nil {
		e.Stderr = io.MultiWriter(errb, stderr)
	}
	code := p.Run(ctx, e, args)
	return Result{Code: code, Stdout: out.String(), Stderr: errb.String()}
}

// CancelOn is a writer that calls Cancel at the first write containing
// Text (at the first write, when Text is ""): a stand-in for Ctrl-C at
// that point of a run.
type CancelOn struct {
	Text   string
	Cancel context.CancelFunc
	once   sync.Once
}

func (c *CancelOn) Write(p []byte) (int, error) {
	if strings.Contains(string(p), c.Text) {
		c.once.Do(c.Cancel)
	}
	return len(p), nil
}

// WantOneLineError checks that r failed with exit code 2 and exactly one
// line on stderr, prefixed "bulkhead:" once and containing every want.
func WantOneLineError(t *testing.T, r Result, want ...string) {
	t.Helper()
	if r.Code != cli.ExitError {
		t.Errorf("exit code %d, want %d (stdout %q, stderr %q)", r.Code, cli.ExitError, r.Stdout, r.Stderr)
	}
	line := strings.TrimSuffix(r.Stderr, "\n")
	if strings.Contains(line, "\n") || !strings.HasPrefix(line, "bulkhead: ") || strings.Count(line, "bulkhead: ") != 1 {
		t.Errorf("stderr is not one line prefixed once with \"bulkhead: \": %q", r.Stderr)
	}
	for _, w := range want {
		if !strings.Contains(line, w) {
			t.Errorf("stderr %q does not name %q", line, w)
		}
	}
}

// WantHelp checks that every command of cmds has a --help (and -h) with
// its flags and examples, printed on stdout alone.
func (p Program) WantHelp(t *testing.T, cmds ...string) {
	t.Helper()
	for _, cmd := range cmds {
		for _, flag := range []string{"--help", "-h"} {
			r := p.Cmd(t, nil, cmd, flag)
			if r.Code != cli.ExitOK || r.Stderr != "" {
				t.Errorf("%s %s: exit %d, stderr %q; want 0 and nothing", cmd, flag, r.Code, r.Stderr)
			}
			for _, want := range []string{"Usage: " + p.Name + " " + cmd, "Flags:", "Examples:\n  " + p.Name + " " + cmd} {
				if !strings.Contains(r.Stdout, want) {
					t.Errorf("%s %s: help lacks %q:\n%s", cmd, flag, want, r.Stdout)
				}
			}
		}
		WantOneLineError(t, p.Cmd(t, nil, cmd, "--no-such-flag"), cmd+":", "unknown flag --no-such-flag", "--help")
		WantOneLineError(t, p.Cmd(t, nil, cmd, "stray"), cmd+":", `"stray"`)
	}
}

// WantEnvHelp checks that each command's help lists the variables it
// reads, and only those.
func (p Program) WantEnvHelp(t *testing.T) {
	t.Helper()
	for cmd, c := range p.Commands {
		h := p.Cmd(t, nil, cmd, "--help").Stdout
		for _, s := range cli.Settings {
			_, no := c.Unused[s.Flag]
			if listed := strings.Contains(h, "  "+s.Env+" "); listed == no {
				t.Errorf("%s --help lists %s: %v; the command uses it: %v", cmd, s.Env, listed, !no)
			}
		}
	}
}

// JSON decodes s, a command's --json output, into a new T.
func JSON[T any](t *testing.T, s string) *T {
	t.Helper()
	v := new(T)
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatalf("--json output: %v\n%s", err, s)
	}
	return v
}

// ReadJSON decodes the file path, a command's --json output, into a new
// T.
func ReadJSON[T any](t *testing.T, path string) *T {
	t.Helper()
	return JSON[T](t, ReadFile(t, path))
}

var spaces = regexp.MustCompile(` +`)

// Squash reduces runs of spaces to one: tables are compared by their
// cells, not their padding.
func Squash(s string) string { return spaces.ReplaceAllString(s, " ") }

// WantCells checks that out contains every want, padding aside.
func WantCells(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(Squash(out), Squash(w)) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

// WantText checks that out contains every want, to the letter.
func WantText(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

// WantServerTx checks the server counts of a run named run, taken by a
// monitor of the server: present (else the test stops, with the monitor's
// error), at least one transaction seen and at most b at once.
func WantServerTx(t *testing.T, run string, maxTx, maxConns *int, monitorErr string, b int) {
	t.Helper()
	if maxTx == nil || maxConns == nil {
		t.Fatalf("%s: no server counts (monitor error %q)", run, monitorErr)
	}
	if *maxTx < 1 {
		t.Errorf("%s: the monitor never saw a transaction", run)
	}
	if *maxTx > b {
		t.Errorf("%s: %d transactions on the server at once, want at most B = %d", run, *maxTx, b)
	}
}

// ReadFile returns the file's text.
func ReadFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// WantSVG checks that b is a well-formed SVG document of the given size
// and returns it as a string.
func WantSVG(t *testing.T, b []byte, w, h float64) string {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(b))
	root := ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
			attr := map[string]string{}
			for _, a := range se.Attr {
				attr[a.Name.Local] = a.Value
			}
			if attr["width"] != svg.Num(w) || attr["height"] != svg.Num(h) {
				t.Errorf("size %sx%s, want %sx%s", attr["width"], attr["height"], svg.Num(w), svg.Num(h))
			}
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return string(b)
}

// WantSVGFile reads path and checks it with WantSVG.
func WantSVGFile(t *testing.T, path string, w, h float64) string {
	t.Helper()
	return WantSVG(t, []byte(ReadFile(t, path)), w, h)
}

// Build builds the program of the package in the current directory into
// a temporary directory and returns its path. Under -short the test is
// skipped.
func Build(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the program; skipped under -short")
	}
	bin := filepath.Join(t.TempDir(), "bulkhead")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// hermeticEnv is the process environment without the variables the
// programs read, so that the test's own settings are the only ones.
func hermeticEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BULKHEAD_") && !strings.HasPrefix(kv, cli.EnvDatabaseURL+"=") {
			env = append(env, kv)
		}
	}
	return env
}

// WantCtrlC runs bin with args, sends it SIGINT once a line of its stderr
// starts with marker, and checks that it exits 130 with every want on
// stdout: what it measured until then.
func WantCtrlC(t *testing.T, bin string, args []string, marker string, want ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = hermeticEnv()
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var errLines []string
	sc := bufio.NewScanner(stderr)
	signalled := false
	for sc.Scan() {
		line := sc.Text()
		errLines = append(errLines, line)
		if !signalled && strings.HasPrefix(line, marker) {
			if err := cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
			signalled = true
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if !signalled || !errors.As(err, &exit) || exit.ExitCode() != cli.ExitInterrupted {
		t.Fatalf("signalled %v, exit %v; want 130\nstderr:\n%s\nstdout:\n%s", signalled, err, strings.Join(errLines, "\n"), stdout.String())
	}
	for _, w := range want {
		if !strings.Contains(stdout.String(), w) {
			t.Errorf("stdout lacks %q:\n%s", w, stdout.String())
		}
	}
}
