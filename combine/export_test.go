package combine

// Queued is the number of requests waiting in node i's combiner for sku,
// not yet in a batch: tests wait for it instead of sleeping.
func (d *Deployment) Queued(i int, sku string) int {
	c := d.Node(i).(*node).combiners[sku]
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}
