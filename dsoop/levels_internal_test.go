package dsoop

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestChooseLevel(t *testing.T) {
	v3 := level{name: "x86-64-v3", flags: []string{"avx", "avx2", "fma"}}
	v4 := level{name: "x86-64-v4", flags: []string{"avx", "avx2", "fma", "avx512f"}}
	flags := func(names ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range names {
			m[n] = true
		}
		return m
	}
	avx512 := flags("sse2", "avx", "avx2", "fma", "avx512f")
	tests := []struct {
		name   string
		levels []level
		host   map[string]bool
		limit  string
		want   string // "" for the baseline
	}{
		{name: "the highest the CPU runs", levels: []level{v3, v4}, host: avx512, want: "x86-64-v4"},
		{name: "whatever the order in the file", levels: []level{v4, v3}, host: avx512, want: "x86-64-v4"},
		{name: "AVX2 but no AVX-512", levels: []level{v3, v4}, host: flags("avx", "avx2", "fma"), want: "x86-64-v3"},
		{name: "no AVX2: the baseline", levels: []level{v3, v4}, host: flags("sse2", "avx"), want: ""},
		{name: "CPU flags unknown: the baseline", levels: []level{v3, v4}, host: nil, want: ""},
		{name: "capped at v3", levels: []level{v3, v4}, host: avx512, limit: "x86-64-v3", want: "x86-64-v3"},
		{name: "capped at the baseline", levels: []level{v3, v4}, host: avx512, limit: BaselineLevel, want: ""},
		{name: "a cap above the CPU", levels: []level{v3, v4}, host: flags("avx", "avx2", "fma"), limit: "x86-64-v4",
			want: "x86-64-v3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok, err := chooseLevel(tt.levels, tt.host, tt.limit)
			require.NoError(t, err)
			assert.Equal(t, tt.want != "", ok)
			assert.Equal(t, tt.want, got.name)
		})
	}
}

func TestChooseLevelUnknownLimit(t *testing.T) {
	_, _, err := chooseLevel([]level{{name: "x86-64-v3"}}, map[string]bool{}, "x86-64-v9")
	assert.EqualError(t, err, "TVMDSOOP_CPU_LEVEL=x86-64-v9 names no level this library holds (x86-64, x86-64-v3)")
}
