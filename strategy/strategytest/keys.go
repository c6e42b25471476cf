package strategytest

import "sort"

// plainSorted is keys without the trial suffix, sorted: a check's detail
// that names keys reads the same in every run.
func (t *trial) plainSorted(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = t.plain(k)
	}
	sort.Strings(out)
	return out
}
