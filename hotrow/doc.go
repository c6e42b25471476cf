// Package hotrow is strategy A of reservebench: one stock row per SKU and a
// conditional UPDATE (available = available - 1 WHERE available > 0).
package hotrow
