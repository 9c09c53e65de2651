-- Schema of the sqlc integration test (integrations_test.go). The test
-- creates it in a schema of its own, so runs never share the table.
CREATE TABLE accounts (
    id      bigserial PRIMARY KEY,
    owner   text   NOT NULL,
    balance bigint NOT NULL DEFAULT 0
);
