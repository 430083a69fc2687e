package dsoop

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestParseCPUFlags(t *testing.T) {
	tests := []struct {
		name    string
		cpuinfo string
		want    map[string]bool
	}{
		{name: "first processor's line", cpuinfo: "processor\t: 0\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n",
			want: map[string]bool{"fpu": true, "avx2": true, "fma": true}},
		{name: "no flags line (another architecture)", cpuinfo: "processor\t: 0\nFeatures\t: fp asimd\n", want: nil},
		{name: "a key that only begins with flags", cpuinfo: "flagship\t: x\nflags\t: sse2\n", want: map[string]bool{"sse2": true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, parseCPUFlags(strings.NewReader(tt.cpuinfo)))
		})
	}
}

func TestMissingFlags(t *testing.T) {
	host := map[string]bool{"sse2": true, "avx2": true}
	assert.Nil(t, missingFlags([]string{"sse2", "avx2"}, host))
	assert.Equal(t, []string{"avx512f", "avx512vl"}, missingFlags([]string{"avx512f", "sse2", "avx512vl"}, host))
}
