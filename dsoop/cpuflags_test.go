package dsoop_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// flaggedLibrary builds a TVM-FFI library whose function seven returns 7,
// recording flags in tvmdsoop_cpu_flags as tf_op.compile does (no symbol for nil
// flags).
func flaggedLibrary(t *testing.T, flags *string) string {
	t.Helper()
	code := `#include <tvm/ffi/c_api.h>
TVM_FFI_DLL_EXPORT int __tvm_ffi_seven(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* result) {
  result->type_index = kTVMFFIInt;
  result->zero_padding = 0;
  result->v_int64 = 7;
  return 0;
}
`
	if flags != nil {
		code += fmt.Sprintf("const char tvmdsoop_cpu_flags[] = %q;\n", *flags)
	}
	return ccLibrary(t, code)
}

// TestCPUFlagsAreCheckedBeforeLoading: a library recording a CPU flag this
// machine lacks is refused by name before it is loaded, where it would die of
// an illegal instruction; one whose flags the CPU has, or that records none,
// loads.
func TestCPUFlagsAreCheckedBeforeLoading(t *testing.T) {
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil || !strings.Contains(string(cpuinfo), "\nflags") {
		t.Skip("no flags in /proc/cpuinfo to check against")
	}
	hostFlag := "fpu" // every x86 CPU's; the first flag listed otherwise
	if !strings.Contains(string(cpuinfo), " fpu ") {
		_, line, _ := strings.Cut(string(cpuinfo), "\nflags")
		_, line, _ = strings.Cut(line, ":")
		hostFlag = strings.Fields(line)[0]
	}
	str := func(s string) *string { return &s }
	tests := []struct {
		name    string
		flags   *string
		wantErr error
		message string
	}{
		{name: "none recorded", flags: nil},
		{name: "the CPU has them", flags: str(hostFlag + " " + hostFlag)},
		{name: "empty list", flags: str("")},
		{name: "one missing", flags: str(hostFlag + " tvmdsoop_no_such_flag"), wantErr: dsoop.ErrUnsupportedCPU,
			message: "it uses tvmdsoop_no_such_flag, which this CPU does not have"},
		{name: "too long to be a list of flags", flags: str(strings.Repeat("x", 5000)), wantErr: dsoop.ErrNotALibrary,
			message: "more than a list of CPU flags"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lib := flaggedLibrary(t, tt.flags)
			m, err := dsoop.Open(lib)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				assert.ErrorContains(t, err, tt.message)
				assert.ErrorContains(t, err, lib)
				return
			}
			require.NoError(t, err)
			defer m.Close()
			fn, err := m.Func("seven")
			require.NoError(t, err)
			defer fn.Close()
			got, err := fn.CallValue()
			require.NoError(t, err)
			assert.Equal(t, int64(7), got)
		})
	}
}
