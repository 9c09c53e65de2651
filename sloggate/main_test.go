//go:build go1.25

package sloggate_test

import (
	"os"
	"testing"

	"github.com/dbbulkhead/bulkhead/internal/leakcheck"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.Run(m)) }
