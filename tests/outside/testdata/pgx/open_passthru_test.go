package stdlib_test

// The passthru arm of tests/outside/run: the rewritten suite with helpers
// that do what the calls they replace did. It shows that the rewrite
// alone changes no result.

import (
	"database/sql"
	"database/sql/driver"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

func gateOpenDB(cfg pgx.ConnConfig, opts ...stdlib.OptionOpenDB) *sql.DB {
	return stdlib.OpenDB(cfg, opts...)
}

func gateOpenDBFromPool(pool *pgxpool.Pool, opts ...stdlib.OptionOpenDB) *sql.DB {
	return stdlib.OpenDBFromPool(pool, opts...)
}

func gateSQLOpen(driverName, dsn string) (*sql.DB, error) { return sql.Open(driverName, dsn) }

func gateSQLOpenDB(c driver.Connector) *sql.DB { return sql.OpenDB(c) }

func gateRegisterConnConfig(c *pgx.ConnConfig) string { return stdlib.RegisterConnConfig(c) }

func gateUnregisterConnConfig(connStr string) { stdlib.UnregisterConnConfig(connStr) }
