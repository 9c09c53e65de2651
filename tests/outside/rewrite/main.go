// Command rewrite routes an outside project's test suite through the
// gate's helpers, for tests/outside/run. It edits a downloaded copy of the
// suite in place, never code of this repository.
//
// In every _test.go file of -dir whose package is -pkg it makes two kinds
// of edit, both by byte offsets so that every other byte, and so every
// line number of the failure output, stays as it was:
//
//   - each selector named by -map (import path, dot, function: the call
//     sites and any other use of the function) becomes the helper's name,
//     e.g. database/sql.Open=gateSQLOpen turns sql.Open(d, dsn) into
//     gateSQLOpen(d, dsn);
//   - in each (*sql.Conn).Raw callback written as a function literal
//     func(dc any) error { ... }, a type assertion of dc to a concrete
//     type, dc.(*stdlib.Conn), becomes gateUnwrap(dc).(*stdlib.Conn), on
//     the same line: it reaches the driver's own connection, as a user of
//     the gate would through bulkhead.Unwrap; an assertion to an
//     interface, dc.(driver.Execer), is left alone, so that it tests what
//     Raw hands over.
//
// It prints one line per edit and, on standard error, warnings for what
// it could not route: a Raw callback that is not a function literal, a
// mapped selector in a file of another package. -check makes it exit 1 on
// a warning, or when it made no edit.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

type mapping struct{ path, name, helper string }

type mapFlag []mapping

func (m *mapFlag) String() string { return fmt.Sprint(*m) }

func (m *mapFlag) Set(s string) error {
	lhs, helper, ok := strings.Cut(s, "=")
	i := strings.LastIndex(lhs, ".")
	if !ok || i <= 0 || i == len(lhs)-1 || helper == "" {
		return fmt.Errorf("want importpath.Func=helper, got %q", s)
	}
	*m = append(*m, mapping{lhs[:i], lhs[i+1:], helper})
	return nil
}

type edit struct {
	start, end int // byte offsets replaced (start == end: an insertion)
	text       string
	line       int
	what       string
}

func main() {
	dir := flag.String("dir", "", "the package directory to rewrite in place")
	pkg := flag.String("pkg", "", "the package clause of the files to rewrite (e.g. stdlib_test)")
	unwrap := flag.String("unwrap", "gateUnwrap", "the helper every Raw callback's driver connection goes through")
	check := flag.Bool("check", false, "exit 1 on a warning or when nothing was rewritten")
	var maps mapFlag
	flag.Var(&maps, "map", "importpath.Func=helper (repeatable)")
	flag.Parse()
	if *dir == "" || *pkg == "" {
		fmt.Fprintln(os.Stderr, "usage: rewrite -dir DIR -pkg PACKAGE [-map importpath.Func=helper]... [-unwrap helper] [-check]")
		os.Exit(2)
	}

	files, err := filepath.Glob(filepath.Join(*dir, "*_test.go"))
	if err != nil {
		fatal(err)
	}
	sort.Strings(files)
	var nEdits, nWarn int
	for _, name := range files {
		ne, nw, err := rewriteFile(name, *pkg, *unwrap, maps)
		if err != nil {
			fatal(err)
		}
		nEdits += ne
		nWarn += nw
	}
	fmt.Printf("rewrite: %d edits, %d warnings in %d files of %s\n", nEdits, nWarn, len(files), *dir)
	if *check && (nWarn > 0 || nEdits == 0) {
		os.Exit(1)
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "rewrite:", err)
	os.Exit(1)
}

func rewriteFile(name, pkg, unwrap string, maps []mapping) (nEdits, nWarn int, err error) {
	src, err := os.ReadFile(name)
	if err != nil {
		return 0, 0, err
	}
	fset := token.NewFileSet()
	// Object resolution stays on: a package name is an unresolved
	// identifier, a local variable of the same name (pgx's tests have
	// sql := "select 42") is not.
	f, err := parser.ParseFile(fset, name, src, parser.ParseComments)
	if err != nil {
		return 0, 0, err
	}
	base := filepath.Base(name)
	warn := func(pos token.Pos, format string, args ...any) {
		nWarn++
		fmt.Fprintf(os.Stderr, "rewrite: warning: %s:%d: %s\n", base, fset.Position(pos).Line, fmt.Sprintf(format, args...))
	}
	own := f.Name.Name == pkg

	// The file's name for each import path it imports.
	names := map[string]string{}
	for _, is := range f.Imports {
		p, err := strconv.Unquote(is.Path.Value)
		if err != nil {
			return 0, 0, err
		}
		n := p[strings.LastIndex(p, "/")+1:]
		if strings.HasPrefix(n, "v") && isDigits(n[1:]) { // .../pgx/v5 is package pgx
			q := strings.TrimSuffix(p, "/"+n)
			n = q[strings.LastIndex(q, "/")+1:]
		}
		if is.Name != nil {
			n = is.Name.Name
		}
		names[p] = n
	}

	var edits []edit
	off := func(p token.Pos) int { return fset.Position(p).Offset }
	uses := map[string]int{}        // qualified uses of each import name
	replaced := map[string]string{} // an import name whose use was replaced: one such selector
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			x, ok := n.X.(*ast.Ident)
			if !ok || x.Obj != nil {
				return true
			}
			uses[x.Name]++
			for _, m := range maps {
				if names[m.path] != x.Name || n.Sel.Name != m.name {
					continue
				}
				if !own {
					warn(n.Pos(), "%s.%s in package %s, not rewritten", x.Name, m.name, f.Name.Name)
					continue
				}
				edits = append(edits, edit{off(n.Pos()), off(n.End()), m.helper, fset.Position(n.Pos()).Line,
					fmt.Sprintf("%s.%s -> %s", x.Name, m.name, m.helper)})
				uses[x.Name]--
				replaced[x.Name] = x.Name + "." + m.name
			}
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Raw" || len(n.Args) != 1 {
				return true
			}
			lit, ok := n.Args[0].(*ast.FuncLit)
			if !ok {
				if isRawCallback(n.Args[0]) {
					warn(n.Pos(), "Raw with a callback that is not a function literal: its driver connection does not go through %s", unwrap)
				}
				return true
			}
			if !rawSignature(lit.Type) {
				return true
			}
			p := lit.Type.Params.List[0]
			if len(p.Names) != 1 || p.Names[0].Name == "_" {
				return true // the callback does not look at the connection
			}
			if !own {
				warn(n.Pos(), "Raw callback in package %s, not rewritten", f.Name.Name)
				return true
			}
			// Only assertions to a concrete type (dc.(*stdlib.Conn),
			// dc.(*mysqlConn)) reach the driver's own connection: those to an
			// interface (dc.(driver.Execer)) see what Raw hands over.
			v := p.Names[0].Name
			ast.Inspect(lit.Body, func(n ast.Node) bool {
				ta, ok := n.(*ast.TypeAssertExpr)
				if !ok {
					return true
				}
				id, ok := ta.X.(*ast.Ident)
				if _, star := ta.Type.(*ast.StarExpr); !ok || !star || id.Name != v {
					return true
				}
				edits = append(edits, edit{off(id.Pos()), off(id.End()), fmt.Sprintf("%s(%s)", unwrap, v), fset.Position(id.Pos()).Line,
					fmt.Sprintf("Raw callback: %s.(%s) -> %s(%s).(...)", v, "*T", unwrap, v)})
				return true
			})
		}
		return true
	})
	if len(edits) == 0 {
		return 0, nWarn, nil
	}
	sort.Slice(edits, func(i, j int) bool { return edits[i].start < edits[j].start })
	var out strings.Builder
	last := 0
	for _, e := range edits {
		if e.start < last {
			return 0, 0, fmt.Errorf("%s:%d: overlapping edits", base, e.line)
		}
		out.Write(src[last:e.start])
		out.WriteString(e.text)
		last = e.end
		fmt.Printf("%s:%d: %s\n", base, e.line, e.what)
	}
	out.Write(src[last:])
	// An import whose every use was replaced would no longer compile
	// ("imported and not used"): keep it used, at the end of the file so
	// that no line moves.
	var keep []string
	for name, sel := range replaced {
		if uses[name] == 0 {
			keep = append(keep, sel)
		}
	}
	sort.Strings(keep)
	for _, sel := range keep {
		fmt.Fprintf(&out, "\nvar _ = %s // kept by tests/outside/rewrite: the import is otherwise unused\n", sel)
		fmt.Printf("%s: var _ = %s appended (import otherwise unused)\n", base, sel)
	}
	// The result must still parse: a broken edit fails here, not as a
	// confusing compile error of the suite.
	if _, err := parser.ParseFile(token.NewFileSet(), name, out.String(), 0); err != nil {
		return 0, 0, fmt.Errorf("rewritten file does not parse: %w", err)
	}
	fi, err := os.Stat(name)
	if err != nil {
		return 0, 0, err
	}
	if err := os.WriteFile(name, []byte(out.String()), fi.Mode().Perm()|0o200); err != nil {
		return 0, 0, err
	}
	return len(edits), nWarn, nil
}

// rawSignature reports whether t is func(any) error (or interface{}),
// the callback of (*sql.Conn).Raw.
func rawSignature(t *ast.FuncType) bool {
	if t.Params == nil || len(t.Params.List) != 1 || t.Results == nil || len(t.Results.List) != 1 {
		return false
	}
	if r, ok := t.Results.List[0].Type.(*ast.Ident); !ok || r.Name != "error" {
		return false
	}
	switch p := t.Params.List[0].Type.(type) {
	case *ast.Ident:
		return p.Name == "any"
	case *ast.InterfaceType:
		return p.Methods == nil || len(p.Methods.List) == 0
	}
	return false
}

// isRawCallback reports whether e may be a Raw callback passed by name: an
// identifier or a selector (a function literal is handled by the caller).
func isRawCallback(e ast.Expr) bool {
	switch e.(type) {
	case *ast.Ident, *ast.SelectorExpr:
		return true
	}
	return false
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}
