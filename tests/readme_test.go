package tests

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Every ```go block of the README and of docs/ compiles: a block starting
// with package is a file; one that declares functions is a file after its
// imports; the others are function bodies given readmeParams.

// readmeBlock is one ```go block of the README: its text and the README line
// of its first line.
type readmeBlock struct {
	line int
	text string
}

// readmeBlocks returns the ```go blocks of the markdown file at path.
func readmeBlocks(t *testing.T, path string) []readmeBlock {
	t.Helper()
	src, err := os.ReadFile(path)
	must(t, err)
	var blocks []readmeBlock
	var cur *readmeBlock
	for i, line := range strings.Split(string(src), "\n") {
		switch fence := strings.TrimSpace(line); {
		case cur == nil && fence == "```go":
			cur = &readmeBlock{line: i + 2}
		case cur != nil && fence == "```":
			blocks, cur = append(blocks, *cur), nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: a ```go block is never closed", path, cur.line-1)
	}
	return blocks
}

// readmeImports maps the package names the README's snippets use to their
// import paths; sqlcdb stands for the package sqlc generates for the user.
var readmeImports = map[string]string{
	"bulkhead":   "github.com/dbbulkhead/bulkhead",
	"httpgate":   "github.com/dbbulkhead/bulkhead/httpgate",
	"pgxgate":    "github.com/dbbulkhead/bulkhead/pgxgate",
	"promgate":   "github.com/dbbulkhead/bulkhead/promgate",
	"fleet":      "github.com/dbbulkhead/bulkhead/fleet",
	"sloggate":   "github.com/dbbulkhead/bulkhead/sloggate",
	"gorm":       "gorm.io/gorm",
	"postgres":   "gorm.io/driver/postgres",
	"mysql":      "github.com/go-sql-driver/mysql",
	"sqlite":     "modernc.org/sqlite",
	"prometheus": "github.com/prometheus/client_golang/prometheus",
	"promhttp":   "github.com/prometheus/client_golang/prometheus/promhttp",
	"sqlcdb":     "example.com/readme/sqlcdb",
	"context":    "context",
	"sql":        "database/sql",
	"driver":     "database/sql/driver",
	"errors":     "errors",
	"fmt":        "fmt",
	"log":        "log",
	"slog":       "log/slog",
	"http":       "net/http",
	"os":         "os",
	"time":       "time",
}

// readmeParams are the values a fragment may use without declaring them.
var readmeParams = []struct{ name, typ string }{
	{"ctx", "context.Context"},
	{"db", "*sql.DB"},
	{"gate", "*bulkhead.Gate"},
	{"inner", "driver.Connector"},
	{"policy", "bulkhead.Policy"},
	{"logger", "*slog.Logger"},
	{"metrics", "*promgate.Collector"},
	{"mux", "*http.ServeMux"},
}

var (
	funcAtColumn0 = regexp.MustCompile(`(?m)^func `)
	qualifiedUse  = regexp.MustCompile(`\b([a-z][a-z0-9]*)\.[A-Za-z_]`)
	lastReturn    = regexp.MustCompile(`(?m)^return\b[^\n]*\n*$`)
	lineComment   = regexp.MustCompile(`(?m)(^|[ \t])//[^\n]*`)
)

// declares reports whether src declares name with := on the left of an
// assignment (name := …, name, err := …, x, name := …).
func declares(src, name string) bool {
	re := regexp.MustCompile(`(?m)^\s*(?:[A-Za-z_][A-Za-z0-9_]*\s*,\s*)*` + regexp.QuoteMeta(name) + `\s*(?:,\s*[A-Za-z_][A-Za-z0-9_]*\s*)*:=`)
	return re.MatchString(src)
}

// importsFor returns the import block for the packages src uses.
func importsFor(src string) string {
	seen := map[string]bool{}
	code := lineComment.ReplaceAllString(src, "$1") // a package named in a comment is not used
	for _, m := range qualifiedUse.FindAllStringSubmatch(code, -1) {
		if p, ok := readmeImports[m[1]]; ok {
			seen[p] = true
		}
	}
	var b strings.Builder
	b.WriteString("import (\n")
	for _, p := range slices.Sorted(maps.Keys(seen)) {
		fmt.Fprintf(&b, "\t%q\n", p)
	}
	b.WriteString(")\n")
	return b.String()
}

// readmeFile turns a block of the markdown file doc into a Go file of
// package main, following the rules the README's Quick start states.
func readmeFile(doc string, b readmeBlock, idx int) string {
	lineDirective := fmt.Sprintf("//line %s:%d\n", doc, b.line)
	if strings.HasPrefix(strings.TrimSpace(b.text), "package ") {
		return lineDirective + b.text
	}
	if funcAtColumn0.MatchString(b.text) {
		main := ""
		if !strings.Contains(b.text, "\nfunc main()") && !strings.HasPrefix(b.text, "func main()") {
			main = "\nfunc main() {}\n"
		}
		return "package main\n\n" + importsFor(b.text) + "\n" + lineDirective + b.text + main
	}
	var params []string
	for _, p := range readmeParams {
		if regexp.MustCompile(`\b`+p.name+`\b`).MatchString(b.text) && !declares(b.text, p.name) {
			params = append(params, p.name+" "+p.typ)
		}
	}
	body := b.text
	if !lastReturn.MatchString(body) {
		body += "return nil\n"
	}
	fn := fmt.Sprintf("func fragment%d(%s) error {\n%s%s}\n", idx, strings.Join(params, ", "), lineDirective, body)
	return "package main\n\n" + importsFor(fn) + "\n" + fn + "\nfunc main() {}\n"
}

// TestEveryGoBlockOfTheReadmeCompilesInAUserModule builds every ```go block
// of README.md and of docs/*.md, each as its own main package of a module
// outside this repository (so that an internal import fails as it would
// for a user), against this repository's modules through a go.work.
func TestEveryGoBlockOfTheReadmeCompilesInAUserModule(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the README's snippets with the go command; skipped with -short")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	type docBlock struct {
		doc string // relative to the repository's root
		readmeBlock
	}
	var blocks []docBlock
	for _, d := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		rel, err := filepath.Rel(root, d)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range readmeBlocks(t, d) {
			blocks = append(blocks, docBlock{rel, b})
		}
	}
	// The README's quick start, the fleet's, and seven integration
	// snippets: fewer means the extraction broke.
	if len(blocks) < 9 {
		t.Fatalf("found %d ```go blocks in README.md and docs/*.md, want at least 9", len(blocks))
	}

	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		p := filepath.Join(dir, name)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(content), 0o644))
	}
	write("go.mod", "module example.com/readme\n\ngo 1.26\n")
	write("go.work", fmt.Sprintf("go 1.26.0\n\nuse (\n\t.\n\t%q\n\t%q\n\t%q\n\t%q\n)\n",
		root, filepath.Join(root, "pgxgate"), filepath.Join(root, "promgate"), filepath.Join(root, "tests")))
	if sum, err := os.ReadFile(filepath.Join(root, "go.work.sum")); err == nil {
		write("go.work.sum", string(sum))
	}
	// The user's sqlc output: a copy of this repository's generated package.
	gen, err := filepath.Glob(filepath.Join(root, "tests", "internal", "sqlcdb", "*.go"))
	if err != nil || len(gen) == 0 {
		t.Fatalf("no generated sqlc package under tests/internal/sqlcdb: %v", err)
	}
	for _, g := range gen {
		src, err := os.ReadFile(g)
		if err != nil {
			t.Fatal(err)
		}
		write(filepath.Join("sqlcdb", filepath.Base(g)), string(src))
	}
	for i, b := range blocks {
		write(fmt.Sprintf("b%02d/main.go", i), readmeFile(b.doc, b.readmeBlock, i))
	}

	cmd := exec.Command("go", "build", "-o", os.DevNull, "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(dir, "go.work"), "GOFLAGS=")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("the Go blocks of README.md and docs/*.md do not compile (%v):\n%s", err, out.String())
	}
}
