-- Schema of strategy C (memquota). Every statement is idempotent: Open runs
-- the whole file under a transaction-scoped advisory lock, so deployments that
-- share a database can open concurrently. Nothing here is ever dropped.

-- The stock each SKU was opened with: the number the audit checks against.
CREATE TABLE IF NOT EXISTS memquota_stock (
    sku        text        PRIMARY KEY,
    total      integer     NOT NULL CHECK (total >= 0),
    nodes      integer     NOT NULL CHECK (nodes >= 1),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- The configured share of every node: the "config" a node restarts from in
-- mode FromConfig, and the upper bound FromLog subtracts its sales from. The
-- shares of a SKU sum to its total (strategy.ShareOf).
CREATE TABLE IF NOT EXISTS memquota_share (
    sku   text    NOT NULL REFERENCES memquota_stock (sku),
    node  integer NOT NULL CHECK (node >= 0),
    share integer NOT NULL CHECK (share >= 0),
    PRIMARY KEY (sku, node)
);

-- The sales log: one row per reservation, written after the node's in-memory
-- counter was decremented. It is the durable truth the audit and a FromLog
-- restart count. Deliberately without a foreign key to memquota_stock: every
-- insert would take a KEY SHARE lock on the SKU's stock row, the one hot row
-- this design exists to avoid.
CREATE TABLE IF NOT EXISTS memquota_sale (
    request_key text        PRIMARY KEY,
    user_id     text        NOT NULL,
    sku         text        NOT NULL,
    node        integer     NOT NULL CHECK (node >= 0),
    status      text        NOT NULL CHECK (status IN ('HELD', 'CONFIRMED', 'RELEASED', 'EXPIRED')),
    expires_at  timestamptz NOT NULL,
    -- A random number per insert: tells a node whose insert ended in doubt
    -- (the connection broke) whether the row is its own.
    attempt     bigint      NOT NULL DEFAULT 0,
    -- A random number per release or expiry that moved the row out of
    -- HELD: tells a node whose transition ended in doubt which rows it moved.
    moved_attempt bigint,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- Requirement 3: one active reservation per user and SKU.
CREATE UNIQUE INDEX IF NOT EXISTS memquota_sale_one_active_per_user
    ON memquota_sale (sku, user_id) WHERE status IN ('HELD', 'CONFIRMED');

-- Per node counts: the audit and a FromLog restart.
CREATE INDEX IF NOT EXISTS memquota_sale_sku_node
    ON memquota_sale (sku, node, status);

-- The expiry job: due HELD rows of the deployment's SKUs.
CREATE INDEX IF NOT EXISTS memquota_sale_due
    ON memquota_sale (sku, expires_at) WHERE status = 'HELD';
