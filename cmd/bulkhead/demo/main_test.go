package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTheDemoPrintsItsThreeLines(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run(context.Background(), nil, &out, &errb); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	if got, want := out.String(), "overload=rejected\nquery=42\navailable=1\n"; got != want {
		t.Fatalf("output %q, want %q", got, want)
	}
}

func TestTheDemoTakesNoArguments(t *testing.T) {
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"--dsn", "postgres://x"}, &out, &errb)
	if code != 2 || out.Len() != 0 || !strings.Contains(errb.String(), "takes no arguments") || !strings.Contains(errb.String(), "go run ./cmd/bulkhead demo --dsn") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}

// The light first command must not link the server drivers: that is what
// keeps its first build short (README).
func TestTheDemoLinksNoServerDriver(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := string(out)
	for _, bad := range []string{"github.com/jackc/pgx", "github.com/go-sql-driver/mysql", "golang.org/x/term"} {
		if strings.Contains(deps, bad) {
			t.Errorf("the demo links %s", bad)
		}
	}
	if !strings.Contains(deps, "github.com/ncruces/go-sqlite3") || !strings.Contains(deps, "github.com/dbbulkhead/bulkhead\n") {
		t.Errorf("the demo does not link the gate and SQLite:\n%s", deps)
	}
}
