-- Schema of the negative controls: strategy A's tables (hotrow's schema.sql),
-- one set per control, named with the control's prefix (ctl_ is replaced by
-- it). The unique constraints and the stock CHECK are added separately
-- (control.go), so that a control can go without exactly the one its
-- mistake removes.
CREATE TABLE IF NOT EXISTS ctl_stock (
  sku       text PRIMARY KEY,
  total     int  NOT NULL CHECK (total >= 0),
  available int  NOT NULL
);
CREATE TABLE IF NOT EXISTS ctl_reservation (
  reservation_id bigserial PRIMARY KEY,
  request_key    text NOT NULL,
  user_id        text NOT NULL,
  sku            text NOT NULL REFERENCES ctl_stock,
  status         text NOT NULL CHECK (status IN ('HELD','CONFIRMED','RELEASED','EXPIRED')),
  expires_at     timestamptz NOT NULL
);
