# bulkhead: make help lists the targets.
GO ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@2025.1.1

.PHONY: help test test-short lint bench generate

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
