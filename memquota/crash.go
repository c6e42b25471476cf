package memquota

import (
	"context"
	"fmt"

	"github.com/reservebench/reservebench/strategy"
)

// CrashMidReserve implements strategy.ReserveCrasher: a reservation on node
// i takes its unit from the counter and dies before its sales-log row is
// written, as a request killed between the two would. The unit is in no row
// and no longer in memory: lost (undersell, positive drift) until the node
// restarts, when FromLog counts it back and FromConfig restores the whole
// configured share (TestCrashBetweenDecrementAndLog, and the node-death
// scenario of table 28-1).
func (d *Deployment) CrashMidReserve(_ context.Context, i int, req strategy.Request) error {
	strategy.CheckNode(i, len(d.nodes))
	d.life.RLock()
	defer d.life.RUnlock()
	n := d.nodes[i].Load()
	if err := n.Check(); err != nil {
		return err
	}
	if err := n.d.known.Check(req); err != nil {
		return err
	}
	// Step 1 of node.reserve, and the request dies before logSale.
	if !n.counters[req.SKU].take() {
		return fmt.Errorf("memquota: node %d: the reserve did not reach its crash point (no unit left)", i)
	}
	return errCrashed
}
