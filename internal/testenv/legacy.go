package testenv

// LegacyValues is tests/legacy/fixtures.py's legacy_values, which made the
// inputs and MobileNet's params of the relay.build fixtures, and so their
// reference outputs: element i of the tensor named name is uniform in
// [-scale, scale) from splitmix64 of the name's FNV-1a hash plus i.
func LegacyValues(name string, n int, scale float64) []float32 {
	h := uint64(0xCBF29CE484222325)
	for _, b := range []byte(name) {
		h = (h ^ uint64(b)) * 0x100000001B3
	}
	out := make([]float32, n)
	for i := range out {
		z := h + uint64(i) + 0x9E3779B97F4A7C15
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		z ^= z >> 31
		u := float64(z>>11) * 0x1p-53
		out[i] = float32((u*2 - 1) * scale)
	}
	return out
}
