package strategytest

import "fmt"

// The kinds below are registered beside the switches of runnerFor and
// Validate, each in a file of its own with its runner: least privilege and
// the faults of issue 16 (a proxy between a node and PostgreSQL, failover to
// a standby, node processes killed with SIGKILL).
const (
	KindLeastPrivilege = "least-privilege" // the runtime role cannot DROP, ALTER, TRUNCATE or DELETE
)

// FaultInput holds the fields of these kinds; it is embedded in Scenario.
type FaultInput struct {
	// Faults (partition) are cycled through by trial.
	Faults []string `json:"faults,omitempty"`
	// Hits (partition) is how many connections a fault cuts, or how many
	// requests are sent while the proxy is dark.
	Hits int `json:"hits,omitempty"`
	// Replication (failover) is "async" or "sync": how the standby the
	// primary fails over to was replicating.
	Replication string `json:"replication,omitempty"`
	// LagRequests (failover) are sent while the standby receives nothing.
	LagRequests int `json:"lag_requests,omitempty"`

	soak *soakPlan // the soak's (Soak builds its input; no file has it)
}

// kindSpec is a kind registered with registerKind: its runner, what it
// needs, the fields a scenario of the kind must have, and the checks of its
// input beyond the ones every scenario gets.
type kindSpec struct {
	run      runnerFunc
	req      requirement
	required []string
	validate func(in *Scenario) error // nil: nothing beyond the required fields
}

var extraKinds = map[string]kindSpec{}

// registerKind adds a kind; it is called from the init function of the
// kind's file.
func registerKind(name string, k kindSpec) {
	if _, dup := extraKinds[name]; dup {
		panic("strategytest: kind registered twice: " + name)
	}
	extraKinds[name] = k
	requiredByKind[name] = k.required
}

// validateExtra validates a scenario of a registered kind, and refuses an
// unknown kind.
func (in *Scenario) validateExtra() error {
	k, ok := extraKinds[in.Kind]
	if !ok {
		return fmt.Errorf("%w: %s: unknown kind %q", ErrInput, in.Name, in.Kind)
	}
	if k.validate == nil {
		return nil
	}
	if err := k.validate(in); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrInput, in.Name, err)
	}
	return nil
}
