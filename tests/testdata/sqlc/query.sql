-- name: CreateAccount :one
INSERT INTO accounts (owner, balance) VALUES ($1, $2)
RETURNING id, owner, balance;

-- name: GetAccount :one
SELECT id, owner, balance FROM accounts WHERE id = $1;

-- name: ListAccounts :many
SELECT id, owner, balance FROM accounts ORDER BY id;

-- name: AddToBalance :execrows
UPDATE accounts SET balance = balance + sqlc.arg(amount) WHERE id = sqlc.arg(id);

-- name: TotalBalance :one
SELECT coalesce(sum(balance), 0)::bigint AS total FROM accounts;
