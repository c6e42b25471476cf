package strategytest

import (
	"hash/crc32"
	"hash/fnv"
	"testing"
)

// TestFixedHashCollisions: each pair of fixedHashCollisions collides under
// its hash, also with a suffix appended, as checkHashCollisions sends it.
func TestFixedHashCollisions(t *testing.T) {
	castagnoli := crc32.MakeTable(crc32.Castagnoli)
	hashes := map[string]func(string) uint32{
		"CRC-32 (IEEE)": func(s string) uint32 { return crc32.ChecksumIEEE([]byte(s)) },
		"CRC-32C":       func(s string) uint32 { return crc32.Checksum([]byte(s), castagnoli) },
		"FNV-1 32":      func(s string) uint32 { h := fnv.New32(); h.Write([]byte(s)); return h.Sum32() },
		"FNV-1a 32":     func(s string) uint32 { h := fnv.New32a(); h.Write([]byte(s)); return h.Sum32() },
		"Java's String.hashCode": func(s string) uint32 {
			var h int32
			for _, c := range s {
				h = 31*h + int32(c)
			}
			return uint32(h)
		},
	}
	for _, c := range fixedHashCollisions {
		f := hashes[c.hash]
		if f == nil {
			t.Fatalf("no function for %s", c.hash)
		}
		for _, p := range [][2]string{c.keys, c.users} {
			for _, suffix := range []string{"", "-kit-hash-123456789-42"} {
				a, b := p[0]+suffix, p[1]+suffix
				if a == b || f(a) != f(b) {
					t.Errorf("%s: %q and %q do not collide (%08x, %08x)", c.hash, a, b, f(a), f(b))
				}
			}
		}
	}
}
