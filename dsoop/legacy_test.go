package dsoop_test

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// The libraries TVM 0.18 built (tests/legacy/build_fixtures.sh), committed with
// their digests.
const legacyFixtures = "../tests/legacy/fixtures"

// legacyDigests reads SHA256SUMS: the tests open the fixtures pinned to them.
func legacyDigests(t *testing.T) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(legacyFixtures, "SHA256SUMS"))
	require.NoError(t, err)
	defer f.Close()
	digests := map[string]string{}
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		digest, name, ok := strings.Cut(scanner.Text(), "  ")
		require.True(t, ok, "a SHA256SUMS line: %q", scanner.Text())
		digests[name] = digest
	}
	require.NoError(t, scanner.Err())
	return digests
}

// openLegacy opens a fixture pinned to its digest.
func openLegacy(t *testing.T, name string) *dsoop.Module {
	t.Helper()
	m, err := dsoop.OpenPinned(filepath.Join(legacyFixtures, name), legacyDigests(t)[name])
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	require.True(t, m.Legacy(), "%s is a library of TVM 0.18", name)
	return m
}

func legacyFunc(t *testing.T, lib, name string) *dsoop.Func {
	t.Helper()
	f, err := openLegacy(t, lib).Func(name)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

// rows are the values a, 0..n*m-1 over n rows of m, as float32.
func rows(n, m int) []float32 {
	a := make([]float32, n*m)
	for i := range a {
		a[i] = float32(i%97) - 40
	}
	return a
}

// callInto calls f on the inputs and an output of n values of T (shaped by
// shape, 1-D when none), and returns the output.
func callInto[T dlpack.Element](t *testing.T, f *dsoop.Func, n int, shape []int64, inputs ...any) []T {
	t.Helper()
	out := make([]T, n)
	require.NoError(t, f.Call(append(inputs, mustTensor(t, out, shape...))...))
	return out
}

func TestLegacyFunctionsComputeValues(t *testing.T) {
	a := rows(64, 8)
	tests := []struct {
		name    string
		lib, fn string
		call    func(t *testing.T, f *dsoop.Func) any
		expect  any
	}{
		{
			name: "elementwise", lib: "legacy.so", fn: "add_one",
			call: func(t *testing.T, f *dsoop.Func) any {
				return callInto[float32](t, f, 3, nil, mustTensor(t, []float32{1, 2, -3}))
			},
			expect: []float32{2, 3, -2},
		},
		{
			name: "tvm.build of one function", lib: "add_one.so", fn: "add_one",
			call: func(t *testing.T, f *dsoop.Func) any {
				return callInto[float32](t, f, 2, nil, mustTensor(t, []float32{0.5, 7}))
			},
			expect: []float32{1.5, 8},
		},
		{
			name: "reduction", lib: "legacy.so", fn: "row_sum",
			call: func(t *testing.T, f *dsoop.Func) any {
				return callInto[float32](t, f, 2, nil, mustTensor(t, []float32{1, 2, 3, 4, 5, 6}, 2, 3))
			},
			expect: []float32{6, 15},
		},
		{
			name: "parallel loop (TVMBackendParallelLaunch)", lib: "legacy.so", fn: "scale_parallel",
			call: func(t *testing.T, f *dsoop.Func) any {
				return callInto[float32](t, f, len(a), []int64{64, 8}, mustTensor(t, a, 64, 8))
			},
			expect: func() []float32 {
				e := make([]float32, len(a))
				for i := range e {
					e[i] = a[i]*3 + float32(i/8)
				}
				return e
			}(),
		},
		{
			name: "workspace memory (TVMBackendAllocWorkspace)", lib: "legacy.so", fn: "two_stage",
			call: func(t *testing.T, f *dsoop.Func) any {
				return callInto[float32](t, f, len(a), nil, mustTensor(t, a))
			},
			expect: func() []float32 {
				e := make([]float32, len(a))
				for i := range e {
					x := a[len(a)-1-i]
					e[i] = x*x + 2
				}
				return e
			}(),
		},
		{
			name: "two inputs", lib: "legacy.so", fn: "add_pair",
			call: func(t *testing.T, f *dsoop.Func) any {
				return callInto[float32](t, f, 2, nil, mustTensor(t, []float32{1, 2}), mustTensor(t, []float32{10, 20}))
			},
			expect: []float32{11, 22},
		},
		{
			name: "bool out (old TVM's uint1)", lib: "legacy.so", fn: "is_positive",
			call: func(t *testing.T, f *dsoop.Func) any {
				return callInto[bool](t, f, 3, nil, mustTensor(t, []float32{1, -2, 0}))
			},
			expect: []bool{true, false, false},
		},
		{
			name: "bool in", lib: "legacy.so", fn: "mask_select",
			call: func(t *testing.T, f *dsoop.Func) any {
				return callInto[float32](t, f, 3, nil, mustTensor(t, []bool{true, false, true}), mustTensor(t, []float32{1, 2, 3}))
			},
			expect: []float32{1, 0, 3},
		},
		{
			name: "int32 in, float64 out", lib: "legacy.so", fn: "cast_int",
			call: func(t *testing.T, f *dsoop.Func) any {
				return callInto[float64](t, f, 2, nil, mustTensor(t, []int32{3, -4}))
			},
			expect: []float64{1.5, -2},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.expect, tc.call(t, legacyFunc(t, tc.lib, tc.fn)))
		})
	}
}

func TestLegacyErrorsComeBackAsErrors(t *testing.T) {
	tests := []struct {
		name    string
		fn      string
		args    func(t *testing.T) []any
		kind    string
		message []string
	}{
		{
			name: "shape mismatch the function checks", fn: "add_pair",
			args: func(t *testing.T) []any {
				return []any{mustTensor(t, []float32{1, 2}), mustTensor(t, []float32{1, 2, 3}), mustTensor(t, make([]float32, 2))}
			},
			kind:    "ValueError",
			message: []string{"add_pair.b.shape[0] has an unsatisfied constraint"},
		},
		{
			name: "dtype mismatch", fn: "add_one",
			args: func(t *testing.T) []any {
				return []any{mustTensor(t, []int32{1}), mustTensor(t, make([]float32, 1))}
			},
			kind:    "ValueError",
			message: []string{"add_one.a.dtype is expected to be float32"},
		},
		{
			name: "packed function of the environment", fn: "extern_call",
			args: func(t *testing.T) []any {
				return []any{mustTensor(t, []float32{1}), mustTensor(t, make([]float32, 1))}
			},
			kind:    "NotImplementedError",
			message: []string{"legacy.so", "'tvmdsoop.legacy_test.extern'", "TVM >= 0.22"},
		},
		{
			name: "a string where the function takes a tensor", fn: "add_one",
			args:    func(t *testing.T) []any { return []any{mustTensor(t, []float32{1}), "x"} },
			kind:    "ValueError",
			message: []string{"add_one: Expect arg[1] to be pointer"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := legacyFunc(t, "legacy.so", tc.fn).Call(tc.args(t)...)
			var tvmErr *dsoop.Error
			require.True(t, errors.As(err, &tvmErr), "a TVM error: %v", err)
			assert.Equal(t, tc.kind, tvmErr.Kind)
			for _, m := range tc.message {
				assert.Contains(t, tvmErr.Message, m)
			}
		})
	}
}

func TestLegacyLookups(t *testing.T) {
	m := openLegacy(t, "legacy.so")
	for _, name := range []string{"no_such_function", "malloc", "__TVMAPISetLastError", "__truncsfhf2"} {
		t.Run(name, func(t *testing.T) {
			_, err := m.Func(name)
			require.ErrorIs(t, err, dsoop.ErrFunctionNotFound, "only the library's own functions are looked up")
		})
	}
	t.Run("a library of TVM-FFI is not legacy", func(t *testing.T) {
		m, err := dsoop.Open(testLib)
		require.NoError(t, err)
		defer m.Close()
		assert.False(t, m.Legacy())
	})
}

// Lookups of one legacy function share its object too, as TVM-FFI ones do;
// each Func still holds its own reference.
func TestLegacyFuncsOfOneFunctionShareItsObject(t *testing.T) {
	m := openLegacy(t, "legacy.so")
	f, err := m.Func("scale_parallel")
	require.NoError(t, err)
	defer f.Close()
	g, err := m.Func("scale_parallel")
	require.NoError(t, err)
	require.True(t, dsoop.SameObject(f, g))
	require.NoError(t, g.Close())
	in, err := dlpack.FromSlice([]float32{0, 1, 2, 3}, 2, 2)
	require.NoError(t, err)
	out := make([]float32, 4)
	o, err := dlpack.FromSlice(out, 2, 2)
	require.NoError(t, err)
	require.NoError(t, f.Call(in, o))
	assert.Equal(t, []float32{0, 3, 7, 10}, out, "as scale_parallel computes (see the concurrent test)")
}

func TestLegacyFuncOutlivesModuleAndRunsConcurrently(t *testing.T) {
	m, err := dsoop.Open(filepath.Join(legacyFixtures, "legacy.so"))
	require.NoError(t, err)
	f, err := m.Func("scale_parallel")
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, m.Close())
	require.NoError(t, inParallel(8, func(g int) error {
		for range 20 {
			a := []float32{float32(g), 1, 2, 3}
			out := make([]float32, 4)
			in, err := dlpack.FromSlice(a, 2, 2)
			if err != nil {
				return err
			}
			o, err := dlpack.FromSlice(out, 2, 2)
			if err != nil {
				return err
			}
			if err := f.Call(in, o); err != nil {
				return err
			}
			if want := []float32{3 * float32(g), 3, 7, 10}; !assert.ObjectsAreEqual(want, out) {
				return errors.New("wrong values from a concurrent call")
			}
		}
		return nil
	}))
}

func TestLegacyLibrariesRefusedBeforeTheyRun(t *testing.T) {
	tests := []struct {
		name, source, message string
	}{
		{
			name: "a context symbol dsoop does not fill",
			source: `void* __TVMBackendFutureHook = 0;
const char __tvm_main__[] = "f";
int f(void) { return 0; }`,
			message: "__TVMBackendFutureHook",
		},
		{
			name: "embedded modules (CUDA code) for the old runtime",
			source: `void* __TVMAPISetLastError = 0;
const unsigned char __tvm_dev_mblob[28] = {20, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
                                           4, 0, 0, 0, 0, 0, 0, 0, 'c', 'u', 'd', 'a'};
int f(void) { return 0; }`,
			message: `a module of kind "cuda"`,
		},
		{
			name: "TVM 0.21, a hybrid of the two ABIs",
			source: `void* __tvm_ffi_library_ctx = 0;
void* __TVMFFIErrorSetRaisedFromCStr = 0;
int add_one(void* self, const void* args, int n, void* result) { return 0; }`,
			message: "TVM 0.21",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dsoop.Open(ccLibrary(t, tc.source))
			require.ErrorIs(t, err, dsoop.ErrLegacyUnsupported)
			assert.Contains(t, err.Error(), tc.message)
		})
	}
}
