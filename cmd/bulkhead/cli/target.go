package cli

import (
	"database/sql/driver"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/dbbulkhead/bulkhead/cmd/bulkhead/internal/demo"
	"github.com/dbbulkhead/bulkhead/pgxgate"
)

// Dialect is the kind of database a target is.
type Dialect int

const (
	DialectSQLite Dialect = iota
	DialectPostgres
	DialectMySQL
)

func (d Dialect) String() string {
	switch d {
	case DialectPostgres:
		return "postgres"
	case DialectMySQL:
		return "mysql"
	}
	return "sqlite"
}

// Title is the database's name for people.
func (d Dialect) Title() string {
	switch d {
	case DialectPostgres:
		return "PostgreSQL"
	case DialectMySQL:
		return "MySQL"
	}
	return "SQLite"
}

// dsnForms is what a DSN may look like, for error messages.
const dsnForms = "want postgres://user:password@host:5432/database or mysql://user:password@host:3306/database"

// ConnectTimeout bounds a dial when the DSN does not say otherwise.
const ConnectTimeout = 5 * time.Second

// StartTimeout bounds the first connection of a run: two dials of a
// server, or, for the embedded SQLite, the compilation of its WebAssembly
// engine, which takes seconds of CPU and many more on a busy machine.
func (t *Target) StartTimeout() time.Duration {
	if t.Dialect == DialectSQLite {
		return 2 * time.Minute
	}
	return 2 * ConnectTimeout
}

// Target is the database a command runs against: PostgreSQL or MySQL from
// a URL, or an embedded in-memory SQLite database when none is given.
type Target struct {
	Dialect Dialect
	Display string // the URL without its password, or "embedded SQLite (in memory)"
	PG      *pgx.ConnConfig
	My      *mysql.Config
}

// ResolveTarget picks the database from --dsn, else DATABASE_URL, else
// the embedded SQLite database.
func (e *Env) ResolveTarget(dsn string, dsnGiven bool) (*Target, error) {
	source := "--dsn"
	if !dsnGiven {
		v, ok := e.Lookup(EnvDatabaseURL)
		if !ok || v == "" {
			return &Target{Dialect: DialectSQLite, Display: "embedded SQLite (in memory)"}, nil
		}
		dsn, source = v, EnvDatabaseURL
	}
	return ParseTarget(source, dsn)
}

// ParseTarget parses a postgres:// or mysql:// URL; source names where it
// came from in errors.
func ParseTarget(source, dsn string) (*Target, error) {
	shown := Redact(dsn)
	if dsn == "" {
		return nil, fmt.Errorf("%s is empty; %s", source, dsnForms)
	}
	scheme, _, ok := strings.Cut(dsn, "://")
	if !ok {
		return nil, fmt.Errorf("%s %q is not a URL; %s", source, shown, dsnForms)
	}
	switch strings.ToLower(scheme) {
	case "postgres", "postgresql":
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, fmt.Errorf("%s %q is not a valid PostgreSQL URL (%v); %s", source, shown, err, dsnForms)
		}
		if cfg.ConnectTimeout == 0 {
			cfg.ConnectTimeout = ConnectTimeout
		}
		return &Target{Dialect: DialectPostgres, Display: shown, PG: cfg}, nil
	case "mysql":
		cfg, err := parseMySQL(dsn)
		if err != nil {
			return nil, fmt.Errorf("%s %q is not a valid MySQL URL (%v); %s", source, shown, err, dsnForms)
		}
		return &Target{Dialect: DialectMySQL, Display: shown, My: cfg}, nil
	}
	return nil, fmt.Errorf("%s %q has scheme %q; %s", source, shown, scheme, dsnForms)
}

// parseMySQL converts mysql://user:pass@host:port/db?params to the
// driver's configuration (its own DSN form is user:pass@tcp(host:port)/db).
func parseMySQL(dsn string) (*mysql.Config, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, err
	}
	if u.Host == "" {
		return nil, fmt.Errorf("no host")
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "3306")
	}
	// The query parameters use the driver's own names (parseTime=true,
	// timeout=5s, ...): let the driver parse them.
	cfg, err := mysql.ParseDSN("/?" + u.RawQuery)
	if err != nil {
		return nil, err
	}
	cfg.Net = "tcp"
	cfg.Addr = host
	cfg.User = u.User.Username()
	cfg.Passwd, _ = u.User.Password()
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	if cfg.Timeout == 0 {
		cfg.Timeout = ConnectTimeout
	}
	return cfg, nil
}

// Connector returns a new connector to the target. On PostgreSQL, app
// becomes the connections' application_name unless keepApp is set and the
// URL names one. Each SQLite connection opens its own in-memory database.
func (t *Target) Connector(app string, keepApp bool) (driver.Connector, error) {
	switch t.Dialect {
	case DialectPostgres:
		cfg := t.PG.Copy()
		if _, ok := cfg.RuntimeParams["application_name"]; !ok || !keepApp {
			cfg.RuntimeParams["application_name"] = app
		}
		return stdlib.GetConnector(*cfg), nil
	case DialectMySQL:
		return mysql.NewConnector(t.My)
	}
	// The commands' statements read no table: a private in-memory
	// database per connection is all they need.
	return demo.SQLite()
}

// GatedConnector is Connector for the gated runs: on PostgreSQL it is
// pgxgate's connector, as the library recommends, so that the gate bounds
// the server and not only the process: a cancelled statement returns
// only after the server stopped it, and a transaction ends on the server
// whatever happened to its context.
func (t *Target) GatedConnector(app string, keepApp bool) (driver.Connector, error) {
	if t.Dialect != DialectPostgres {
		return t.Connector(app, keepApp)
	}
	cfg := t.PG.Copy()
	if _, ok := cfg.RuntimeParams["application_name"]; !ok || !keepApp {
		cfg.RuntimeParams["application_name"] = app
	}
	return pgxgate.Connector(cfg), nil
}

// PlainConnector returns a connector to a PostgreSQL target with
// application_name app, for reading the server's views.
func (t *Target) PlainConnector(app string) driver.Connector {
	cfg := t.PG.Copy()
	cfg.RuntimeParams["application_name"] = app
	return stdlib.GetConnector(*cfg)
}

var passwordInURL = regexp.MustCompile(`(://[^:/@]*:)[^@/]*@`)

// Redact hides the password of a URL, even one that does not parse.
func Redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		return u.Redacted()
	}
	return passwordInURL.ReplaceAllString(dsn, "${1}xxxxx@")
}
