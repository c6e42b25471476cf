package slotrows

// The SQL the plan tests explain.
const (
	SQLClaimSlot         = sqlClaimSlot
	SQLInsertReservation = sqlInsertReservation
)
