package dsoop

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestReadVMFunctions(t *testing.T) {
	const magic = 0xD225DE2F4214151E
	tests := []struct {
		name  string
		parts []any
		want  []string
	}{
		{"kernels, builtins and VM functions", vmExecutable(magic, "0.14", uint32(0), "vm.builtin.copy",
			uint32(1), "main", uint32(2), "fused_add", uint32(1), "forward"), []string{"main", "forward"}},
		{"the first version's magic", vmExecutable(0xD225DE2F4214151D, "0.14", uint32(1), "main"), []string{"main"}},
		{"another magic", vmExecutable(1, "0.14", uint32(1), "main"), nil},
		{"another VM version", vmExecutable(magic, "0.13", uint32(1), "main"), nil},
		{"a table of 2^40 functions", []any{uint64(magic), "0.14", uint64(1 << 40)}, nil},
		{"a name of a megabyte", []any{uint64(magic), "0.14", uint64(1), uint32(1), uint64(1 << 20)}, nil},
		{"cut in the parameter names", []any{uint64(magic), "0.14", uint64(1), uint32(1), "main", uint64(0),
			uint64(9), uint64(2), uint64(5), uint64(1 << 30)}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bin := libraryBin(tc.parts...)
			got, err := readVMFunctions(&binReader{r: bytes.NewReader(bin), off: 8, limit: uint64(len(bin))})
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.want == nil, err != nil, "error: %v", err)
		})
	}
}
