module github.com/dbbulkhead/bulkhead

go 1.22

require golang.org/x/sync v0.11.0
