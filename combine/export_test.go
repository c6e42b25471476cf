package combine

// Queued is node i's strategy.Queuer answer for sku, for tests that hold a
// *Deployment.
func (d *Deployment) Queued(i int, sku string) int {
	return d.Node(i).(*node).Queued(sku)
}
