# bulkhead: make help lists the targets.
#
# The repository holds several modules (README: Testing), tied together by
# go.work: ALL names every package of every one of them.
GO ?= go
ALL := github.com/dbbulkhead/bulkhead/...
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
SQLC := github.com/sqlc-dev/sqlc/cmd/sqlc@v1.31.1
# The oldest Go the root module says it builds with (its go line).
MIN_GO := go1.22.12

.PHONY: help test test-short lint compat bench bench-cost bench-pg bench-smoke overload overload-adaptive overload-shift overload-ceiling overload-priority overload-shapes fleet chart sqlc sqlc-check

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

test: ## every test of every module under -race, against PostgreSQL and MariaDB (see README: Testing)
	$(GO) test -race -count=1 $(ALL)

test-short: ## the fake-driver tests alone, no server needed
	$(GO) test -race -short -count=1 $(ALL)

lint: ## go vet and staticcheck, every module
	$(GO) vet $(ALL)
	$(GO) run $(STATICCHECK) $(ALL)

compat: ## build the root module (its packages, not its tests) with the oldest Go its go line names (downloads that toolchain)
	GOWORK=off GOTOOLCHAIN=$(MIN_GO) $(GO) build ./ ./httpgate ./fleet ./sloggate

bench: ## the gate alone, its connection path, and database/sql on the fake driver, gated and plain side by side (bench.txt; see BENCHMARKS.md)
	{ $(GO) test -run '^$$' -bench 'Semaphore|GatePermit|WaiterMemory|ConnPath' -benchmem -count 6 . && \
	  $(GO) test -run '^$$' -bench 'FakeDB|GateCost|WaitingOperation' -benchmem -count 6 ./tests ./tests/fakebench; } | tee bench.txt

bench-cost: ## the gate's cost per operation on the fake driver, this tree against BASE (a git revision, default main) in one paired run (pair.txt)
	tests/fakebench/pair $${BASE:-main} 10

bench-pg: ## PostgreSQL throughput, plain and gated in alternate processes (bench-pg.txt; needs the server)
	$(GO) test -c -o bench-pg.test ./tests && for i in 1 2 3 4 5 6 7 8 9 10; do \
	  if [ $$((i % 2)) = 1 ]; then o="plain gated"; else o="gated plain"; fi; \
	  for db in $$o; do ./bench-pg.test -test.run '^$$' -test.bench "Postgres/.*/.*/db=$$db" -test.benchmem || exit 1; done; \
	done | tee bench-pg.txt; rm -f bench-pg.test

bench-smoke: ## every benchmark once, as CI runs them (no timings)
	$(GO) test -run '^$$' -bench . -benchtime=1x $(ALL)

overload: ## the overload experiment (module experiments), open-loop on local PostgreSQL, S = 5, 10, 20 ms: pool as semaphore, wait-before-checkout bulkhead, gate, 3 rounds; redraws docs/overload.svg (~7 min)
	$(GO) run ./experiments overload --dsn $${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test} \
	  --service 5ms,10ms,20ms --configs semaphore,waitfirst,gate --max-concurrent 2 --rounds 3 --duration 3s \
	  --json overload.json --chart docs/overload.svg

# The adaptive experiments (BENCHMARKS.md: No number to guess), S = 10 ms, B = 2, 3 rounds each.
ADAPTIVE_RUN = $(GO) run ./experiments overload --dsn $${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test} --service 10ms --rounds 3

overload-adaptive: ## steady 1, 3, 6 × C: the gate with B measured against adaptive B (ceiling 16), failsafe-go's bulkhead and adaptive limiter (overload-adaptive.json; ~9 min)
	$(ADAPTIVE_RUN) --max-concurrent 2 --loads 1,3,6 --duration 10s --ceiling 16 --configs fsbulkhead,fsadaptive,fsadaptive-wait,gate,adaptive --json overload-adaptive.json

overload-shift: ## the work triples halfway, offered 2 × C: goodput before and after, over time (overload-shift.json, docs/shift.svg; ~4 min)
	$(ADAPTIVE_RUN) --max-concurrent 2 --loads 2 --shift 3 --duration 12s --ceiling 16 --configs fsbulkhead,fsadaptive,fsadaptive-wait,gate,adaptive --json overload-shift.json --chart docs/shift.svg

overload-ceiling: ## B misconfigured to 16 at 3 × C: the static gate at 16 (by the rule), then the gate at B = 2 beside adaptive B with ceiling 16 (overload-ceiling-*.json; ~3 min)
	$(ADAPTIVE_RUN) --loads 3 --duration 10s --max-concurrent 16 --configs gate --json overload-ceiling-static16.json
	$(ADAPTIVE_RUN) --max-concurrent 2 --loads 3 --duration 10s --ceiling 16 --configs gate,adaptive,fsadaptive --json overload-ceiling.json

overload-priority: ## 3 × C, a fifth of the requests high-priority: their goodput against the gate serving them alone (overload-priority.json; ~5 min)
	$(ADAPTIVE_RUN) --max-concurrent 2 --loads 3 --high 0.2 --duration 10s --ceiling 16 --configs fsbulkhead,gate,adaptive,alone --json overload-priority.json

overload-shapes: ## every request shape (cpu, sleep, mix, outlier, lock, hotrow, roundtrips) at 1, 3, 6 × C: static B = 1 to 16 (the best is the oracle), adaptive (ceiling 16), failsafe-go's bulkhead (B = CPUs) and limiter (overload-shapes.json, docs/shapes.svg: a chart per shape; ~70 min)
	$(ADAPTIVE_RUN) --shape cpu,sleep,mix,outlier,lock,hotrow,roundtrips --loads 1,3,6 --duration 6s --ceiling 16 \
	  --configs fsbulkhead,fsadaptive,static,adaptive --sweep 1,2,4,8,16 --json overload-shapes.json --chart docs/shapes.svg

fleet: ## the fleet experiment (module experiments) on local PostgreSQL: 4 processes, T = 8; one process, static B = T/4 and T/8, the fleet budget, PgBouncer; deploy, SIGKILL, scale-down; prints the table, redraws docs/fleet.svg (~2 min; pgbouncer arm: apt-get install pgbouncer)
	$(GO) run ./experiments fleet --dsn $${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test?sslmode=disable} \
	  --json fleet.json --chart docs/fleet.svg

chart: ## regenerate docs/load.svg: gated vs plain database/sql under overload (local PostgreSQL, ~25 s)
	$(GO) run ./cmd/bulkhead load --dsn $${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test} --clients 32 --duration 10s --max-concurrent 4 --max-queue 4 --queue-wait 20ms --hold 20ms --deadline 100ms --baseline --max-open-conns 4 --chart docs/load.svg

sqlc: ## regenerate tests/internal/sqlcdb from tests/testdata/sqlc (sqlc, pinned)
	$(GO) run $(SQLC) generate -f tests/testdata/sqlc/sqlc.yaml

sqlc-check: ## fail if tests/internal/sqlcdb differs from what sqlc generates now
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	mkdir -p "$$tmp/testdata" && cp -R tests/testdata/sqlc "$$tmp/testdata/" && \
	$(GO) run $(SQLC) generate -f "$$tmp/testdata/sqlc/sqlc.yaml" && \
	diff -ru tests/internal/sqlcdb "$$tmp/internal/sqlcdb" && echo "tests/internal/sqlcdb is current"
