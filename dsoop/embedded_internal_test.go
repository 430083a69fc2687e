package dsoop

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// libraryBin writes serialized modules as TVM does (see readEmbeddedModules):
// their length, then parts as encode writes them (u64s, u32s, strings as strs).
func libraryBin(parts ...any) []byte {
	body := encode(parts...)
	return encode(uint64(len(body)), body)
}

// cudaBytes is a CUDA module's bytes: its format, then what TVM writes after it.
func cudaBytes(format string) string {
	return string(libraryBin(format)[8:]) + "function info and code"
}

func TestParseEmbeddedModules(t *testing.T) {
	// An import tree of the library and n modules it imports: indptr, child indices.
	tree := func(n uint64) []any {
		parts := []any{n + 2, uint64(0)}
		for i := uint64(0); i <= n; i++ {
			parts = append(parts, n)
		}
		parts = append(parts, n)
		for i := uint64(1); i <= n; i++ {
			parts = append(parts, i)
		}
		return parts
	}
	with := func(parts ...[]any) []any {
		var all []any
		for _, p := range parts {
			all = append(all, p...)
		}
		return all
	}
	tests := []struct {
		name    string
		bin     []byte
		want    []embeddedModule
		wantErr bool
	}{
		{"the library alone", libraryBin(with(tree(0), []any{"_lib"})...), nil, false},
		{"CUDA source", libraryBin(with(tree(1), []any{"_lib", cudaKind, cudaBytes("cuda")})...),
			[]embeddedModule{{kind: "cuda", format: "cuda"}}, false},
		{"compiled CUDA and a VM executable", libraryBin(with(tree(2), []any{"_lib", cudaKind, cudaBytes("fatbin"), vmExecutableKind, string(validExecutable().bytes())})...),
			[]embeddedModule{{kind: "cuda", format: "fatbin"}, {kind: vmExecutableKind, vmFunctions: []string{"main"},
				vmParams: map[string][]string{"main": {"x"}}}}, false},
		{"a VM executable's functions", libraryBin(with(tree(1), []any{"_lib", vmExecutableKind,
			string(validExecutable().bytes())})...),
			[]embeddedModule{{kind: vmExecutableKind, vmFunctions: []string{"main"},
				vmParams: map[string][]string{"main": {"x"}}}}, false},
		{"a VM executable that fails verification", libraryBin(with(tree(1), []any{"_lib", vmExecutableKind,
			string(validExecutable().bytes()[:60])})...), nil, true},
		{"empty", nil, nil, true},
		{"a module's bytes past the end", libraryBin(with(tree(1), []any{"_lib", "relax.VMExecutable", uint64(1 << 40)})...), nil, true},
		{"a kind past the end", libraryBin(with(tree(1), []any{"_lib", uint64(3), "ab"})...), nil, true},
		{"a kind of a megabyte", libraryBin(with(tree(1), []any{"_lib", uint64(1 << 20)})...), nil, true},
		{"a CUDA format longer than its module", libraryBin(with(tree(1), []any{"_lib", cudaKind, uint64(4), "cuda"})...), nil, true},
		{"no import tree", libraryBin(uint64(0)), nil, true},
		{"an import tree of 2^64 entries", libraryBin(uint64(1<<64 - 1)), nil, true},
		{"child indices of 2^61 entries", libraryBin(uint64(2), uint64(0), uint64(0), uint64(1<<61)), nil, true},
		{"a length of 2^64-1", binary.LittleEndian.AppendUint64(nil, 1<<64-1), nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseEmbeddedModules(bytes.NewReader(tc.bin))
			if tc.wantErr {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// FuzzParseEmbeddedModules: whatever a library's serialized modules hold, the
// reader answers, without panicking or allocating what a length claims.
func FuzzParseEmbeddedModules(f *testing.F) {
	f.Add(libraryBin(uint64(2), uint64(0), uint64(0), uint64(1), uint64(0), "_lib"))
	f.Add(libraryBin(uint64(3), uint64(0), uint64(1), uint64(1), uint64(1), uint64(1), "_lib", cudaKind, cudaBytes("cuda")))
	f.Add(libraryBin(uint64(3), uint64(0), uint64(1), uint64(1), uint64(1), uint64(1), "_lib", vmExecutableKind,
		string(validExecutable().bytes())))
	f.Fuzz(func(t *testing.T, bin []byte) {
		_, _ = parseEmbeddedModules(bytes.NewReader(bin)) // any answer will do
	})
}
