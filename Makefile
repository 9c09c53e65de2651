# bulkhead: make help lists the targets.
GO ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
SQLC := github.com/sqlc-dev/sqlc/cmd/sqlc@v1.31.1

.PHONY: help test test-short lint bench generate chart sqlc sqlc-check

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

test: ## every test under -race, against PostgreSQL (see README: Testing)
	$(GO) test -race -count=1 ./...

test-short: ## the fake-driver tests alone, no server needed
	$(GO) test -race -short -count=1 ./...

lint: ## go vet and staticcheck
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

bench: ## benchmarks, gated and plain side by side (benchstat reads the output)
	$(GO) test -run '^$$' -bench . -benchmem -count 6 . | tee bench.txt

generate: ## regenerate wrap_gen.go
	$(GO) generate ./...

chart: ## regenerate docs/load.png: gated vs plain database/sql under overload (local PostgreSQL, ~25 s)
	$(GO) run ./cmd/bulkhead load --dsn $${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test} --clients 32 --duration 10s --max-concurrent 4 --max-queue 4 --queue-wait 20ms --hold 20ms --deadline 100ms --baseline --max-open-conns 4 --chart docs/load.png

sqlc: ## regenerate internal/sqlcdb from testdata/sqlc (sqlc, pinned)
	$(GO) run $(SQLC) generate -f testdata/sqlc/sqlc.yaml

sqlc-check: ## fail if internal/sqlcdb differs from what sqlc generates now
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	mkdir -p "$$tmp/testdata" && cp -R testdata/sqlc "$$tmp/testdata/" && \
	$(GO) run $(SQLC) generate -f "$$tmp/testdata/sqlc/sqlc.yaml" && \
	diff -ru internal/sqlcdb "$$tmp/internal/sqlcdb" && echo "internal/sqlcdb is current"
