package controls

import (
	"github.com/reservebench/reservebench/memquota"
	"github.com/reservebench/reservebench/strategy"
)

// memquotaControls are the controls built on strategy C (memquota) rather
// than A: the checks of the node-process scenarios concern what a node
// keeps in memory, which strategy A has none of. Each is memquota as
// registered, with one claim it cannot keep.
func memquotaControls() []Control {
	m := memquota.New(memquota.Options{Restart: memquota.FromConfig})
	m.Claims |= strategy.SurvivesRestart
	return []Control{
		fromStrategy(m, "ctl-memquota-claims-restart", "strategy C restarting from config, claiming survives-restart", "C28-15",
			"strategy C, whose node process starts from its configured share, claiming survives-restart",
			join(expect("process-restart", strategy.SurvivesRestart), expect("process-release", strategy.SurvivesRestart))),
		fromStrategy(memquota.New(memquota.Options{Restart: memquota.FromLog, RestartWithoutDrain: true}),
			"ctl-restart-without-drain", "memquota-recover with one mistake", "C28-15",
			"Restart recounts the sales log without waiting for the node's requests in flight: one that took its unit and commits after the recount has it sold again",
			expect("restart-in-flight", strategy.SurvivesRestart)),
		fromStrategy(memquota.New(memquota.Options{Restart: memquota.FromLog, SettleWhileRunning: true}),
			"ctl-settle-while-running", "memquota-recover with one mistake", "new",
			"Settle gives a unit in doubt back when its row is not in the log yet, although the backend that inserted it is still there: its COMMIT, which the client gave up on, lands later and the unit is sold twice",
			expect("commit-timeout", strategy.Conserves)),
		fromStrategy(memquota.New(memquota.Options{FlightByJoinedText: true}),
			"ctl-flight-by-joined-text", "memquota with one mistake", "new",
			"identical requests in flight on a node are recognised by key, user and SKU joined with ':': K:1 by u and K by 1:u are merged, and the second gets the first's answer",
			expect("deployment-contract", contract)),
		fromStrategy(memquota.New(memquota.Options{SoldOutProbesKeyOnly: true}),
			"ctl-sold-out-probes-key-only", "memquota with one mistake", "new",
			"a node with no unit, seeing an insert of the key in flight, waits for the key's row alone: a resend whose first attempt still waits on its user (no row yet) is answered SOLD_OUT, and the first then holds",
			expect("deployment-contract", contract)),
		fromStrategy(memquota.New(memquota.Options{Restart: memquota.FromLog, AttemptsCounted: true}),
			"ctl-attempts-counted", "memquota-recover with one mistake", "new",
			"inserts and moves are numbered by a counter of the process from 1: a process that attached after another settles its release in doubt by a number the other used, and gives back the other's unit as well",
			expect("deployment-contract", strategy.NoOversell)),
		fromStrategy(memquota.New(memquota.Options{Restart: memquota.FromLog, MovesToRestarted: true}),
			"ctl-moves-to-restarted", "memquota-recover with one mistake", "C28-15",
			"Settle gives the unit of a release in doubt to the node running now, although that node restarted since and its recount of the log already counted the unit",
			expect("commit-timeout", strategy.SurvivesRestart)),
		fromStrategy(memquota.New(memquota.Options{Restart: memquota.FromLog, RollbackGivesBack: true}),
			"ctl-expiry-rollback-gives-back", "memquota-recover with one mistake", "C28-09",
			"an expiry job held open that is rolled back gives back the units of the rows it had moved: they stay HELD and their units sell again",
			expect("deployment-contract", contract)),
		fromStrategy(memquota.New(memquota.Options{Restart: memquota.FromLog, RecountEvenShare: true}),
			"ctl-recount-even-share", "memquota-recover with one mistake", "C28-15",
			"a restarted node recounts from an even split of the SKU's total instead of its configured share: a node whose share was smaller sells units another node holds",
			expect("restart", strategy.SurvivesRestart)),
		fromStrategy(memquota.New(memquota.Options{Restart: memquota.FromLog, RecountSkipsDue: true}),
			"ctl-recount-skips-due", "memquota-recover with one mistake", "C28-08",
			"a restarted node recounts only the HELD rows whose expires_at has not passed: a due reservation no job has moved has its unit sold again, and its late payment confirms it too",
			expect("deployment-contract", contract)),
		fromStrategy(memquota.New(memquota.Options{Restart: memquota.FromLog, RecountRecentOnly: true}),
			"ctl-recount-recent-only", "memquota-recover with one mistake", "C28-15",
			"a restarted node recounts only the sales of the last 48 hours (\"a hold lives at most a day\"): a unit paid for longer ago is sold again",
			expect("deployment-contract", contract)),
		fromStrategy(memquota.New(memquota.Options{Restart: memquota.FromLog, RestartFallsBack: true}),
			"ctl-restart-falls-back", "memquota-recover with one mistake", "C28-15",
			"a restart whose recount of the sales log fails (a lock, a timeout) starts the node from its share of the total instead of failing (\"a node that will not start is worse\"): it sells again what is sold",
			expect("deployment-contract", contract)),
		fromStrategy(memquota.New(memquota.Options{Restart: memquota.FromLog, AuditFromLog: true}),
			"ctl-audit-from-log", "memquota-recover with one mistake", "new",
			"Audit reports each node's available as its share minus its active rows in the log (\"reproducible from the database alone\"), not its live counter: a unit lost from memory shows as available, and the drift that would show it is 0",
			expect("deployment-contract", contract)),
		fromStrategy(memquota.New(memquota.Options{Restart: memquota.FromLog, GiveUpIsRollback: true}),
			"ctl-give-up-is-rollback", "memquota-recover with one mistake", "new",
			"a session's COMMIT that fails because its caller gave up is taken for a rollback (\"a cancelled statement does not happen\"), and its units go back to the counter: a COMMIT waiting for a standby happens all the same, and the unit sells twice",
			expect("commit-timeout", strategy.NoOversell)),
		fromStrategy(memquota.New(memquota.Options{Restart: memquota.FromLog, SettleByKey: true}),
			"ctl-settle-by-key", "memquota-recover with one mistake", "new",
			"Settle looks for the row of a unit in doubt by its key alone: a request whose client gave up while it waited behind its own twin on another node, which then committed, keeps its unit for ever",
			expect("deployment-contract", strategy.Conserves)),
		fromStrategy(memquota.New(memquota.Options{Restart: memquota.FromConfig, ZeroShareIsUnset: true}),
			"ctl-zero-share-unset", "strategy C with one mistake", "new",
			"a node's share of 0 in the config is read as \"not set\" and the node gets the even split: a SKU of 3 with shares [0, 3, 0] sells 5",
			expect("deployment-contract", strategy.NoOversell)),
		fromStrategy(memquota.New(memquota.Options{Restart: memquota.FromConfig, CeilShare: true}),
			"ctl-ceil-share", "strategy C with one mistake", "new",
			"the even split gives each node but the last ceil(total/nodes) units and the last the rest: one unit on 3 nodes sells 2",
			expect("deployment-contract", strategy.NoOversell)),
		fromStrategy(memquota.New(memquota.Options{Restart: memquota.FromConfig, CheckThenTake: true}),
			"ctl-check-then-take", "strategy C with one mistake", "new",
			"a node's counter checks that a unit is left, then takes it, in two atomic steps: two requests at once can both take the last unit",
			expect("deployment-contract", strategy.NoOversell)),
	}
}
