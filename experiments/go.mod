module github.com/dbbulkhead/bulkhead/experiments

go 1.26.0

require (
	github.com/dbbulkhead/bulkhead v0.0.0-00010101000000-000000000000
	github.com/dbbulkhead/bulkhead/cmd/bulkhead v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.13.0
	go.uber.org/goleak v1.3.0
)

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/dbbulkhead/bulkhead/pgxgate v0.0.0-00010101000000-000000000000 // indirect
	github.com/failsafe-go/failsafe-go v0.9.8 // indirect
	github.com/go-sql-driver/mysql v1.10.1 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/ncruces/go-sqlite3 v0.32.0 // indirect
	github.com/ncruces/julianday v1.0.0 // indirect
	github.com/tetratelabs/wazero v1.11.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.24.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/term v0.48.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)

// Local work: the modules of this repository.
replace (
	github.com/dbbulkhead/bulkhead => ../
	github.com/dbbulkhead/bulkhead/cmd/bulkhead => ../cmd/bulkhead
	github.com/dbbulkhead/bulkhead/pgxgate => ../pgxgate
)
