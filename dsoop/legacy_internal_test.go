package dsoop

import (
	"debug/elf"
	"testing"

	"github.com/stretchr/testify/assert"
)

// symbol is a defined dynamic symbol of that type, global unless weak.
func symbol(name string, typ elf.SymType, weak bool) elf.Symbol {
	bind := elf.STB_GLOBAL
	if weak {
		bind = elf.STB_WEAK
	}
	return elf.Symbol{Name: name, Info: elf.ST_INFO(bind, typ), Section: elf.SectionIndex(12)}
}

func fn(name string) elf.Symbol      { return symbol(name, elf.STT_FUNC, false) }
func pointer(name string) elf.Symbol { return symbol(name, elf.STT_OBJECT, true) }

func TestReadLegacyABI(t *testing.T) {
	undefined := elf.Symbol{Name: "__TVMAPISetLastError", Info: elf.ST_INFO(elf.STB_GLOBAL, elf.STT_OBJECT), Section: elf.SHN_UNDEF}
	tests := []struct {
		name    string
		symbols []elf.Symbol
		want    *legacyABI
	}{
		{
			name: "TVM 0.18, tvm.build of one function",
			symbols: []elf.Symbol{
				fn("add_one"), pointer("__TVMAPISetLastError"), symbol("__tvm_main__", elf.STT_OBJECT, false),
				symbol("__truncsfhf2", elf.STT_FUNC, true),
			},
			want: &legacyABI{functions: map[string]bool{"add_one": true}, context: []string{"__TVMAPISetLastError"}},
		},
		{
			name: "several functions, parallel loops, extern calls",
			symbols: []elf.Symbol{
				pointer("__tvm_module_ctx"), pointer("__TVMBackendParallelLaunch"), fn("a"), fn("b"),
				symbol("weak_fn", elf.STT_FUNC, true),
			},
			want: &legacyABI{
				functions: map[string]bool{"a": true, "b": true, "weak_fn": true},
				context:   []string{"__tvm_module_ctx", "__TVMBackendParallelLaunch"},
			},
		},
		{
			name:    "embedded modules",
			symbols: []elf.Symbol{symbol(legacyDevBlobSymbol, elf.STT_OBJECT, false), fn("f")},
			want:    &legacyABI{functions: map[string]bool{"f": true}, devBlob: true},
		},
		{
			name: "TVM 0.21: TVM-FFI's convention under bare names",
			symbols: []elf.Symbol{
				pointer("__tvm_ffi_library_ctx"), pointer("__TVMFFIFunctionCall"), fn("add_one"),
			},
			want: &legacyABI{
				functions: map[string]bool{"add_one": true}, context: []string{"__TVMFFIFunctionCall"}, tvm021: true,
			},
		},
		{
			name:    "TVM-FFI exports: TVM >= 0.22, loaded by TVM's loader",
			symbols: []elf.Symbol{pointer("__TVMBackendParallelLaunch"), fn("__tvm_ffi_add_one")},
		},
		{
			name:    "an early tvm-ffi library, with 0.21's context name",
			symbols: []elf.Symbol{pointer("__tvm_ffi_library_ctx"), fn("__tvm_ffi_add_one")},
		},
		{
			name:    "a plain library",
			symbols: []elf.Symbol{fn("add_one"), symbol("table", elf.STT_OBJECT, false)},
		},
		{
			name:    "context symbols it only refers to",
			symbols: []elf.Symbol{fn("add_one"), undefined},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, readLegacyABI(tc.symbols))
		})
	}
}
