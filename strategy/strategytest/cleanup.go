package strategytest

// onCleanup registers f to run once the trial's final checks are done and
// its deployment is closed: what a runner set up for the deployment it
// left in t.dep (a proxy, a pool, a node process) must outlive those checks.
// They run last registered first, as t.Cleanup's do.
func (t *trial) onCleanup(f func()) { t.cleanups = append(t.cleanups, f) }

func (t *trial) runCleanups() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
	t.cleanups = nil
}
