package tests

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"modernc.org/sqlite"

	"github.com/dbbulkhead/bulkhead"
	"github.com/dbbulkhead/bulkhead/internal/fakedb"
	"github.com/dbbulkhead/bulkhead/sloggate"
	"github.com/dbbulkhead/bulkhead/tests/internal/sqlcdb"
)

// The README's GORM snippet: GORM on the gated *sql.DB.
func Example_gorm() {
	type Order struct {
		ID   int64
		Item string
	}

	cfg, err := pgx.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	g, err := bulkhead.New(stdlib.GetConnector(*cfg),
		bulkhead.Policy{MaxConcurrent: 16, MaxQueue: 32, QueueWait: 50 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	gdb, err := gorm.Open(postgres.New(postgres.Config{Conn: g.OpenDB()}), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}

	// One permit from BEGIN to COMMIT, whatever runs inside.
	err = gdb.Transaction(func(tx *gorm.DB) error {
		return tx.Create(&Order{Item: "tea"}).Error
	})
	// Create alone runs in GORM's default transaction: one permit too.
	if err == nil {
		err = gdb.Create(&Order{Item: "cups"}).Error
	}
	if errors.Is(err, bulkhead.ErrRejected) {
		log.Print("database busy: answer 503, see package httpgate")
	}
}

// The README's sqlc snippet: sqlc's generated code (sql_package
// "database/sql", the default) on the gated *sql.DB.
func Example_sqlc() {
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	db := bulkhead.Connector(stdlib.GetConnector(*cfg),
		bulkhead.Policy{MaxConcurrent: 16, MaxQueue: 32, QueueWait: 50 * time.Millisecond}).OpenDB()
	defer db.Close()

	q := sqlcdb.New(db) // each call: one permit, given back when it returns
	acct, err := q.GetAccount(ctx, 1)
	if err != nil {
		log.Fatal(err)
	}

	tx, err := db.BeginTx(ctx, nil) // one permit until Commit or Rollback
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback()
	qtx := q.WithTx(tx) // its calls take no permit of their own
	if _, err := qtx.AddToBalance(ctx, sqlcdb.AddToBalanceParams{ID: acct.ID, Amount: -5}); err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
}

// The README's MariaDB snippet: go-sql-driver/mysql's connector, with
// interpolateParams so that a statement with arguments is one operation
// (without it the driver answers driver.ErrSkip and database/sql prepares
// the statement and runs it again, admitted a second time).
func Example_mariadb() {
	cfg, err := mysql.ParseDSN("app@tcp(127.0.0.1:3306)/shop?parseTime=true")
	if err != nil {
		log.Fatal(err)
	}
	cfg.InterpolateParams = true
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		log.Fatal(err)
	}
	db := bulkhead.Connector(connector,
		bulkhead.Policy{MaxConcurrent: 8, MaxQueue: 16, QueueWait: 50 * time.Millisecond}).OpenDB()
	defer db.Close()
	_, err = db.Exec("UPDATE stock SET qty = qty - ? WHERE item = ?", 1, "tea")
	if errors.Is(err, bulkhead.ErrRejected) {
		log.Print("database busy, retry later")
	}
}

// sqliteConnector adapts a driver.Driver and its DSN to a
// driver.Connector, for drivers that register a driver only.
type sqliteConnector struct {
	d   driver.Driver
	dsn string
}

func (c sqliteConnector) Connect(context.Context) (driver.Conn, error) { return c.d.Open(c.dsn) }
func (c sqliteConnector) Driver() driver.Driver                        { return c.d }

// The README's SQLite snippet: modernc.org/sqlite through a four-line
// connector adapter. SQLite has one writer: with B > 1, a second writing
// transaction fails with SQLITE_BUSY, or with _pragma=busy_timeout(ms)
// waits inside the driver while it holds its permit.
func Example_sqlite() {
	c := sqliteConnector{d: &sqlite.Driver{}, dsn: "file:app.db?_pragma=busy_timeout(5000)"}
	db := bulkhead.Connector(c, bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 8, QueueWait: 100 * time.Millisecond}).OpenDB()
	defer db.Close()
	_, err := db.Exec("INSERT INTO events (at) VALUES (?)", time.Now().Unix())
	if err != nil {
		log.Print(err)
	}
}

// JoinEvents feeds one gate's events to several consumers, here a count
// of rejections and a logger.
func ExampleJoinEvents() {
	var rejected int
	count := bulkhead.Events{OnReject: func(bulkhead.Event) { rejected++ }}
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Value.Kind() == slog.KindDuration {
				return slog.Attr{}
			}
			return a
		},
	}))
	g, err := bulkhead.New(fakedb.New(), bulkhead.Policy{MaxConcurrent: 1, MaxQueue: 1, QueueWait: time.Nanosecond},
		bulkhead.WithEvents(bulkhead.JoinEvents(count, sloggate.Events(logger))))
	if err != nil {
		log.Fatal(err)
	}
	db := g.OpenDB()
	defer db.Close()

	tx, _ := db.Begin()
	_, err = db.Exec("UPDATE stock SET qty = 0") // Q=1 and a 1ns queue wait
	fmt.Println(errors.Is(err, bulkhead.ErrQueueTimeout), rejected)
	tx.Rollback()
	// Output:
	// level=WARN msg="bulkhead: rejected" kind=statement reason=queue_timeout
	// true 1
}
