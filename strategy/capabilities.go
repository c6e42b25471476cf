package strategy

import "strings"

// Capabilities says which optional interfaces a deployment and its nodes
// implement. Probe resolves them once per deployment, the way database/sql
// checks a driver's optional interfaces once, so the harness, the benchmarks
// and a service ask a bool instead of asserting types on every call.
type Capabilities struct {
	// On every node.
	Confirm       bool // Confirmer
	Release       bool // Releaser
	Expire        bool // Expirer
	Sessions      bool // SessionOpener
	ExpirySession bool // ExpirySessionOpener
	Lock          bool // LockTaker (its sessions are LockedSessions)
	Queue         bool // Queuer

	// On the deployment.
	Age             bool // Ager
	Restart         bool // Restarter
	CrashMidReserve bool // ReserveCrasher

	// On the Meta.
	Attach bool // Meta.Attach is set
}

// Probe resolves the capabilities of a deployment of meta. It asks node 0;
// the contract says every node of a deployment has the same capabilities
// (the conformance kit checks that).
func Probe(meta Meta, dep Deployment) Capabilities {
	c := ProbeNode(dep.Node(0))
	_, c.Age = dep.(Ager)
	_, c.Restart = dep.(Restarter)
	_, c.CrashMidReserve = dep.(ReserveCrasher)
	c.Attach = meta.Attach != nil
	return c
}

// ProbeNode resolves the node-level capabilities of one node, for checking
// that every node of a deployment agrees with node 0.
func ProbeNode(n Strategy) Capabilities {
	var c Capabilities
	_, c.Confirm = n.(Confirmer)
	_, c.Release = n.(Releaser)
	_, c.Expire = n.(Expirer)
	_, c.Sessions = n.(SessionOpener)
	_, c.ExpirySession = n.(ExpirySessionOpener)
	_, c.Lock = n.(LockTaker)
	_, c.Queue = n.(Queuer)
	return c
}

// Missing names, in the order given, the capabilities of want that c lacks,
// e.g. "Expirer, Ager", or "" when none is missing.
func (c Capabilities) Missing(want Capabilities) string {
	var out []string
	for _, x := range []struct {
		want, have bool
		name       string
	}{
		{want.Confirm, c.Confirm, "Confirmer"},
		{want.Release, c.Release, "Releaser"},
		{want.Expire, c.Expire, "Expirer"},
		{want.Sessions, c.Sessions, "SessionOpener"},
		{want.ExpirySession, c.ExpirySession, "ExpirySessionOpener"},
		{want.Lock, c.Lock, "LockTaker"},
		{want.Queue, c.Queue, "Queuer"},
		{want.Age, c.Age, "Ager (on the Deployment)"},
		{want.Restart, c.Restart, "Restarter (on the Deployment)"},
		{want.CrashMidReserve, c.CrashMidReserve, "ReserveCrasher (on the Deployment)"},
		{want.Attach, c.Attach, "Meta.Attach"},
	} {
		if x.want && !x.have {
			out = append(out, x.name)
		}
	}
	return strings.Join(out, ", ")
}
