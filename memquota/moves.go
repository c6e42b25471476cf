package memquota

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// moveDoubt is a release or expiry whose statement (or whose session's
// COMMIT) failed without telling whether it committed: the rows it may have
// moved out of HELD carry its attempt number, and their units go back once
// its backend is gone and the log says which rows they are.
type moveDoubt struct {
	attempt int64
	pid     uint32
	// owners are the nodes when the doubt began: a node restarted since
	// has counted the log itself, and gets nothing back from the doubt.
	owners []*node
}

// addMove records a move in doubt.
func (d *Deployment) addMove(attempt int64, pid uint32) {
	owners := make([]*node, len(d.nodes))
	for i := range d.nodes {
		owners[i] = d.nodes[i].Load()
	}
	d.mmu.Lock()
	d.moves = append(d.moves, moveDoubt{attempt: attempt, pid: pid, owners: owners})
	d.nmoves.Store(int32(len(d.moves)))
	d.mmu.Unlock()
}

// movePIDs returns the backends of the moves in doubt.
func (d *Deployment) movePIDs() []int32 {
	d.mmu.Lock()
	defer d.mmu.Unlock()
	pids := make([]int32, 0, len(d.moves))
	for _, m := range d.moves {
		pids = append(pids, int32(m.pid))
	}
	return pids
}

// settleMovesSQL tells, for each move in doubt, whether its backend is
// still there, and lists the rows that carry its attempt (none: a NULL
// row).
const settleMovesSQL = `
SELECT m.ord,
       EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = m.pid),
       s.node, s.sku
FROM unnest($1::int4[], $2::int8[]) WITH ORDINALITY AS m (pid, attempt, ord)
LEFT JOIN memquota_sale s ON s.moved_attempt = m.attempt`

// settleMoves gives back the units of the moves in doubt whose backends
// are gone, to their owners unless those restarted since, and forgets
// those moves. The caller holds d.life shared and d.settleMu.
func (d *Deployment) settleMoves(ctx context.Context) (int, error) {
	d.mmu.Lock()
	moves := append([]moveDoubt(nil), d.moves...)
	d.mmu.Unlock()
	if len(moves) == 0 {
		return 0, nil
	}
	pids := make([]int32, len(moves))
	attempts := make([]int64, len(moves))
	for i, m := range moves {
		pids[i], attempts[i] = int32(m.pid), m.attempt
	}
	rows, err := d.db.Query(ctx, settleMovesSQL, pids, attempts)
	if err != nil {
		return 0, fmt.Errorf("memquota: settle moves: %w", err)
	}
	type row struct {
		Ord     int64
		Running bool
		Node    *int32
		SKU     *string
	}
	found, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return 0, fmt.Errorf("memquota: settle moves: %w", err)
	}
	running := map[int64]bool{}
	for _, r := range found {
		if r.Running {
			running[r.Ord-1] = true
		}
	}
	back := 0
	for _, r := range found {
		i := r.Ord - 1
		if running[i] || r.Node == nil {
			continue
		}
		owner := int(*r.Node)
		m := moves[i]
		if owner < 0 || owner >= len(d.nodes) {
			continue
		}
		to := m.owners[owner]
		if d.nodes[owner].Load() != to {
			if !d.opts.MovesToRestarted {
				continue // a node restarted since counted the log itself
			}
			to = d.nodes[owner].Load()
		}
		if c := to.counters[*r.SKU]; c != nil {
			c.put()
			back++
		}
	}
	settled := map[int64]bool{}
	for i, m := range moves {
		if !running[int64(i)] {
			settled[m.attempt] = true
		}
	}
	d.mmu.Lock()
	kept := d.moves[:0]
	for _, m := range d.moves {
		if !settled[m.attempt] {
			kept = append(kept, m)
		}
	}
	d.moves = kept
	d.nmoves.Store(int32(len(d.moves)))
	d.mmu.Unlock()
	return back, nil
}
