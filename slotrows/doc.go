// Package slotrows is strategy B of reservebench: one row per unit, claimed
// with SELECT ... FOR UPDATE SKIP LOCKED.
package slotrows
