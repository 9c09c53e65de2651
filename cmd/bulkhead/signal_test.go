package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// buildTool builds the command into a temporary directory.
func buildTool(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "bulkhead")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// hermeticEnv is the process environment without the variables the tool
// reads, so that the test's own settings are the only ones.
func hermeticEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "BULKHEAD_") && !strings.HasPrefix(kv, "DATABASE_URL=") {
			env = append(env, kv)
		}
	}
	return env
}

func TestCtrlCExits130AfterPrintingWhatWasMeasured(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command; skipped under -short")
	}
	bin := buildTool(t)
	for _, c := range []struct {
		name   string
		args   []string
		marker string // a stderr line that shows the run is under way
		table  []string
	}{
		{"load", []string{"load", "--clients", "2", "--duration", "10m", "--hold", "2ms", "--deadline", "10m",
			"--max-concurrent", "1", "--max-queue", "1", "--queue-wait", "10m", "--progress", "1ns"},
			"gated ", []string{"attempted", "(interrupted)"}},
		{"overload", []string{"overload", "--capacity", "50", "--loads", "1", "--duration", "10m", "--warmup", "0s",
			"--capacity-duration", "150ms", "--cpu-rows", "100", "--deadline", "10s"},
			"overload: S p50", []string{"overload on embedded SQLite", "interrupted"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, c.args...)
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
				if !signalled && strings.HasPrefix(line, c.marker) {
					if err := cmd.Process.Signal(os.Interrupt); err != nil {
						t.Fatal(err)
					}
					signalled = true
				}
			}
			err = cmd.Wait()
			var exit *exec.ExitError
			if !signalled || !errors.As(err, &exit) || exit.ExitCode() != exitInterrupted {
				t.Fatalf("signalled %v, exit %v; want 130\nstderr:\n%s\nstdout:\n%s", signalled, err, strings.Join(errLines, "\n"), stdout.String())
			}
			for _, want := range c.table {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
				}
			}
		})
	}
}
