package stdlib_test

// The gate arm of tests/outside/run: every *sql.DB the suite opens is
// sql.OpenDB(bulkhead.Connector(pgx's connector, gatePolicy)), gatePolicy
// from zz_outside_policy_test.go (testdata/policy_test.go); sql.Open and
// sql.OpenDB go through zz_outside_open_gate_test.go (testdata/open_gate_test.go).

import (
	"database/sql"

	"github.com/dbbulkhead/bulkhead"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// stdlib.OpenDB(cfg, opts...) is sql.OpenDB(stdlib.GetConnector(cfg, opts...)).
func gateOpenDB(cfg pgx.ConnConfig, opts ...stdlib.OptionOpenDB) *sql.DB {
	return sql.OpenDB(bulkhead.Connector(stdlib.GetConnector(cfg, opts...), gatePolicy))
}

// stdlib.OpenDBFromPool is sql.OpenDB(stdlib.GetPoolConnector(pool, opts...))
// with SetMaxIdleConns(0).
func gateOpenDBFromPool(pool *pgxpool.Pool, opts ...stdlib.OptionOpenDB) *sql.DB {
	db := sql.OpenDB(bulkhead.Connector(stdlib.GetPoolConnector(pool, opts...), gatePolicy))
	db.SetMaxIdleConns(0)
	return db
}

func gateRegisterConnConfig(c *pgx.ConnConfig) string { return stdlib.RegisterConnConfig(c) }

func gateUnregisterConnConfig(connStr string) { stdlib.UnregisterConnConfig(connStr) }
