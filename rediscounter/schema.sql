-- Strategy "rediscounter": the stock is counted in Redis; PostgreSQL keeps
-- the configured totals and the reservations (the order log written after
-- the Redis decrement). There is no available column: Redis holds it.
CREATE TABLE IF NOT EXISTS rediscounter_stock (
  sku   text PRIMARY KEY,
  total int  NOT NULL CHECK (total >= 0)
);
CREATE TABLE IF NOT EXISTS rediscounter_reservation (
  request_key text PRIMARY KEY,
  user_id     text NOT NULL,
  sku         text NOT NULL REFERENCES rediscounter_stock,
  status      text NOT NULL CHECK (status IN ('HELD','CONFIRMED','RELEASED','EXPIRED')),
  expires_at  timestamptz NOT NULL,
  updated_at  timestamptz NOT NULL DEFAULT now(),
  -- unit_owed: a transition moved the row out of HELD and may not have
  -- given its unit back in Redis yet; the expiry job gives it back (once:
  -- the key's marker) and clears it.
  unit_owed   boolean NOT NULL DEFAULT false
);
CREATE UNIQUE INDEX IF NOT EXISTS rediscounter_one_active
  ON rediscounter_reservation (sku, user_id) WHERE status IN ('HELD','CONFIRMED');
-- Tables created before unit_owed existed get it here.
ALTER TABLE rediscounter_reservation ADD COLUMN IF NOT EXISTS unit_owed boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS rediscounter_unit_owed
  ON rediscounter_reservation (sku) WHERE unit_owed;
