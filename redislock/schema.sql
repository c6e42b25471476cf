-- Strategy "redislock" (seed 002): the stock row and the conditional UPDATE
-- of strategy A, entered only under a per-SKU Redis lock. {p} is the table
-- prefix: "redislock", or "redislock_lockonly" for the negative control
-- that drops the database's condition, and then the CHECK on available too.
CREATE TABLE IF NOT EXISTS {p}_stock (
  sku       text PRIMARY KEY,
  total     int  NOT NULL CHECK (total >= 0),
  available int  NOT NULL{check}
);
CREATE TABLE IF NOT EXISTS {p}_reservation (
  request_key text PRIMARY KEY,
  user_id     text NOT NULL,
  sku         text NOT NULL REFERENCES {p}_stock,
  status      text NOT NULL CHECK (status IN ('HELD','CONFIRMED','RELEASED','EXPIRED')),
  expires_at  timestamptz NOT NULL,
  updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX IF NOT EXISTS {p}_one_active
  ON {p}_reservation (sku, user_id) WHERE status IN ('HELD','CONFIRMED');
