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
	m.Name = "ctl-memquota-claims-restart"
	m.Description = "negative control: strategy C restarting from config, claiming survives-restart"
	m.Correctness = "none: it claims what it cannot keep"
	m.Claims |= strategy.SurvivesRestart
	return []Control{{
		Meta:   m,
		Case:   "C28-15",
		Breaks: "strategy C, whose node process starts from its configured share, claiming survives-restart",
		Expect: join(expect("process-restart", strategy.SurvivesRestart), expect("process-release", strategy.SurvivesRestart)),
	}}
}
