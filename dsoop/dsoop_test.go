package dsoop_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
	"github.com/tvmdsoop/tvmdsoop/dsoop"
	"github.com/tvmdsoop/tvmdsoop/internal/testenv"
)

// The test libraries built by tests/modules/build_modules.py: testLib by
// apache-tvm, ffiLib with tvm-ffi's C++ macros (scalars, errors, probes), cudaLib
// by apache-tvm for target cuda; modelsDir holds the whole models of
// tests/modules/build_models.py (Relax VM executables).
var testLib, ffiLib, cudaLib, modelsDir string

// TestMain builds the test functions with apache-tvm, in the project's venv (or
// the Python named by TVMDSOOP_PYTHON). `make test` sets up both the venv and
// TVMDSOOP_LIBRARY_PATH. A child process of the runtime tests only runs Init.
func TestMain(m *testing.M) {
	if os.Getenv(initChildEnv) != "" {
		runInitChild()
	}
	if lib := os.Getenv(libraryChildEnv); lib != "" {
		runLibraryChild(lib)
	}
	dir, err := os.MkdirTemp("", "dsoop-test")
	if err != nil {
		panic(err)
	}
	if err := testenv.RunPython("..", "tests/modules/build_modules.py", dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	modelsDir = filepath.Join(dir, "models")
	if err := testenv.RunPython("..", "tests/modules/build_models.py", modelsDir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testLib = filepath.Join(dir, "testfuncs.so")
	ffiLib = filepath.Join(dir, "ffifuncs.so")
	cudaLib = filepath.Join(dir, "cudafuncs.so")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func mustTensor[T dlpack.Element](t testing.TB, data []T, shape ...int64) *dlpack.Tensor {
	t.Helper()
	tensor, err := dlpack.FromSlice(data, shape...)
	require.NoError(t, err)
	return tensor
}

// vector describes a slice as a 1-D tensor, which cannot fail: for goroutines
// other than the test's, where mustTensor's FailNow would not stop the test.
func vector[T dlpack.Element](data []T) *dlpack.Tensor {
	t, err := dlpack.FromSlice(data)
	if err != nil {
		panic(err) // a 1-D shape of the slice's length always fits it
	}
	return t
}

// inParallel runs work(0) to work(n-1) on goroutines of their own and returns
// their errors joined, for the test goroutine to assert on: FailNow works there only.
func inParallel(n int, work func(g int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() { errs[g] = work(g) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func openFunc(t *testing.T, name string) *dsoop.Func {
	t.Helper()
	return openFuncIn(t, testLib, name)
}

func openFuncB(b *testing.B, name string) *dsoop.Func {
	b.Helper()
	return openFuncIn(b, testLib, name)
}

func openFuncIn(t testing.TB, lib, name string) *dsoop.Func {
	t.Helper()
	m, err := dsoop.Open(lib)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	f, err := m.Func(name)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

func TestCallComputesValues(t *testing.T) {
	tests := []struct {
		name   string
		fn     string
		inputs func(t *testing.T) []*dlpack.Tensor
		out    []float32
		shape  []int64
	}{
		{
			name:   "add one",
			fn:     "add_one",
			inputs: func(t *testing.T) []*dlpack.Tensor { return []*dlpack.Tensor{mustTensor(t, []float32{1, 2, 3})} },
			out:    []float32{2, 3, 4},
		},
		{
			name: "vector add",
			fn:   "vector_add",
			inputs: func(t *testing.T) []*dlpack.Tensor {
				return []*dlpack.Tensor{mustTensor(t, []float32{1, 2}), mustTensor(t, []float32{10, 20})}
			},
			out: []float32{11, 22},
		},
		{
			name: "nine inputs in order",
			fn:   "sum9",
			inputs: func(t *testing.T) []*dlpack.Tensor {
				var ts []*dlpack.Tensor
				for range 9 {
					ts = append(ts, mustTensor(t, []float32{1, 2}))
				}
				return ts
			},
			out: []float32{45, 90}, // (1+2+...+9) * x
		},
		{
			name: "transpose changes the shape",
			fn:   "transpose",
			inputs: func(t *testing.T) []*dlpack.Tensor {
				return []*dlpack.Tensor{mustTensor(t, []float32{1, 2, 3, 4, 5, 6}, 2, 3)}
			},
			out:   []float32{1, 4, 2, 5, 3, 6},
			shape: []int64{3, 2},
		},
		{
			name:   "empty tensor",
			fn:     "add_one",
			inputs: func(t *testing.T) []*dlpack.Tensor { return []*dlpack.Tensor{mustTensor(t, []float32{})} },
			out:    []float32{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := openFunc(t, tc.fn)
			out := make([]float32, len(tc.out))
			outTensor := mustTensor(t, out, tc.shape...)
			var args []any
			for _, in := range tc.inputs(t) {
				args = append(args, in)
			}
			require.NoError(t, f.Call(append(args, outTensor)...))
			assert.Equal(t, tc.out, out)
		})
	}
}

func TestCallMixedDtypes(t *testing.T) {
	f := openFunc(t, "scale_mixed")
	out := make([]float64, 3)
	err := f.Call(
		mustTensor(t, []float32{1.5, 2, -1}),
		mustTensor(t, []int32{2, 3, 4}),
		mustTensor(t, []float64{0.25, 0, 10}),
		mustTensor(t, out),
	)
	require.NoError(t, err)
	assert.Equal(t, []float64{3.25, 6, 6}, out)
}

func TestErrors(t *testing.T) {
	m, err := dsoop.Open(testLib)
	require.NoError(t, err)

	t.Run("missing file", func(t *testing.T) {
		_, err := dsoop.Open("/no/such/dir/lib.so")
		require.ErrorIs(t, err, os.ErrNotExist)
		assert.Contains(t, err.Error(), "/no/such/dir/lib.so")
	})
	t.Run("not a library", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "notalib.so")
		require.NoError(t, os.WriteFile(path, []byte("plain text"), 0o644))
		_, err := dsoop.Open(path)
		require.ErrorIs(t, err, dsoop.ErrNotALibrary)
		assert.Contains(t, err.Error(), path)
	})
	t.Run("not a regular file", func(t *testing.T) {
		_, err := dsoop.Open("/dev/zero") // hashing it would never end
		assert.ErrorContains(t, err, "not a regular file")
	})
	t.Run("NUL bytes", func(t *testing.T) {
		_, err := dsoop.Open(testLib + "\x00junk")
		assert.ErrorContains(t, err, "NUL")
		_, err = m.Func("add_one\x00junk")
		assert.ErrorContains(t, err, "bad function name")
	})
	t.Run("unknown function", func(t *testing.T) {
		_, err := m.Func("no_such_function")
		require.ErrorIs(t, err, dsoop.ErrFunctionNotFound)
		assert.Contains(t, err.Error(), "no_such_function")
	})
	t.Run("TVM's own shape check", func(t *testing.T) {
		f := openFunc(t, "add_one_4")
		err := f.Call(mustTensor(t, []float32{1, 2, 3}), mustTensor(t, make([]float32, 3)))
		var tvmErr *dsoop.Error
		require.ErrorAs(t, err, &tvmErr)
		assert.Equal(t, "ValueError", tvmErr.Kind)
		assert.Contains(t, err.Error(), "add_one_4")
		// The next good call works.
		out := make([]float32, 4)
		require.NoError(t, f.Call(mustTensor(t, []float32{1, 2, 3, 4}), mustTensor(t, out)))
		assert.Equal(t, []float32{2, 3, 4, 5}, out)
	})
	t.Run("wrong dtype", func(t *testing.T) {
		f := openFunc(t, "add_one")
		err := f.Call(mustTensor(t, []int32{1}), mustTensor(t, make([]int32, 1)))
		var tvmErr *dsoop.Error
		require.ErrorAs(t, err, &tvmErr)
		assert.Contains(t, tvmErr.Message, "float32")
	})
	t.Run("closed function", func(t *testing.T) {
		f, err := m.Func("add_one")
		require.NoError(t, err)
		require.NoError(t, f.Close())
		require.NoError(t, f.Close())
		err = f.Call(mustTensor(t, []float32{1}), mustTensor(t, make([]float32, 1)))
		require.ErrorIs(t, err, dsoop.ErrClosed)
		assert.EqualError(t, err, "dsoop: add_one: already closed", "dsoop: is said once")
	})
}

// A tvm.compile'd CUDA library needs TVM's CUDA runtime to load. Where that
// cannot load (this CPU machine has no CUDA driver), the error says so and why.
func TestCUDALibraryWithoutTheCUDARuntime(t *testing.T) {
	_, err := dsoop.Open(cudaLib)
	require.Error(t, err)
	assert.Contains(t, err.Error(), cudaLib)
	if !errors.Is(err, dsoop.ErrCUDARuntimeNotLoaded) {
		// A machine with a CUDA driver loads the runtime; the CUDA source this
		// library carries then needs a compiler registered by TVM's Python package.
		assert.ErrorIs(t, err, dsoop.ErrCUDASourceNotCompiled)
		return
	}
	assert.Contains(t, err.Error(), "load_from_bytes.cuda")
	assert.Contains(t, err.Error(), "libtvm_runtime_cuda.so")
	assert.Contains(t, err.Error(), "libcuda.so.1")
	// The runtime is still usable.
	f := openFunc(t, "add_one")
	out := make([]float32, 1)
	require.NoError(t, f.Call(mustTensor(t, []float32{1}), mustTensor(t, out)))
	assert.Equal(t, []float32{2}, out)
}

func TestModuleOpenAndClose(t *testing.T) {
	a, err := dsoop.Open(testLib)
	require.NoError(t, err)
	t.Chdir(filepath.Dir(testLib))
	b, err := dsoop.Open(filepath.Base(testLib))
	require.NoError(t, err)
	assert.Equal(t, testLib, a.Path())
	assert.Equal(t, a.Path(), b.Path())

	f, err := a.Func("add_one")
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, a.Close())
	require.NoError(t, a.Close(), "Close is idempotent")
	_, err = a.Func("add_one")
	require.ErrorIs(t, err, dsoop.ErrClosed)

	// b still holds the library, and f keeps working after every Module is closed.
	g, err := b.Func("add_one")
	require.NoError(t, err)
	defer g.Close()
	require.NoError(t, b.Close())
	out := make([]float32, 2)
	require.NoError(t, f.Call(mustTensor(t, []float32{1, 2}), mustTensor(t, out)))
	assert.Equal(t, []float32{2, 3}, out)
	require.NoError(t, g.Call(mustTensor(t, []float32{5, 6}), mustTensor(t, out)))
	assert.Equal(t, []float32{6, 7}, out)

	// Opening again after the last Close loads the library anew.
	c, err := dsoop.Open(testLib)
	require.NoError(t, err)
	defer c.Close()
	h, err := c.Func("add_one")
	require.NoError(t, err)
	defer h.Close()
	require.NoError(t, h.Call(mustTensor(t, []float32{0, 0}), mustTensor(t, out)))
	assert.Equal(t, []float32{1, 1}, out)
}

func TestScalarArgumentsAndResults(t *testing.T) {
	tests := []struct {
		name string
		fn   string
		args []any
		want any
	}{
		{"int64", "add_int", []any{int64(40), int64(2)}, int64(42)},
		{"Go ints of every width", "add_int", []any{int8(-3), uint32(5)}, int64(2)},
		{"float64", "scale", []any{1.5, 4.0}, 6.0},
		{"float32 widens", "scale", []any{float32(0.5), 3}, 1.5},
		{"bool", "negate", []any{true}, false},
		{"string", "greet", []any{"gopher"}, "hello, gopher"},
		{"long string", "greet", []any{"a name longer than a small string"}, "hello, a name longer than a small string"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := openFuncIn(t, ffiLib, tc.fn).CallValue(tc.args...)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestTensorAndScalar(t *testing.T) {
	out := make([]float32, 3)
	require.NoError(t, openFuncIn(t, ffiLib, "fill").Call(mustTensor(t, out), 2.5))
	assert.Equal(t, []float32{2.5, 2.5, 2.5}, out)
}

// Calls reuse their argument frames: alternate between many tensors (past the
// ones passed directly to C), few, values, and strings, checking every result.
func TestArgumentFramesAreReused(t *testing.T) {
	sum9, addOne := openFunc(t, "sum9"), openFunc(t, "add_one")
	greet := openFuncIn(t, ffiLib, "greet")
	for i := range 50 {
		xs := make([]any, 10)
		for k := range 9 {
			xs[k] = mustTensor(t, []float32{float32(i + k)})
		}
		out := make([]float32, 1)
		xs[9] = mustTensor(t, out)
		require.NoError(t, sum9.Call(xs...))
		want := float32(0)
		for k := range 9 {
			want += float32(i+k) * float32(k+1)
		}
		assert.Equal(t, want, out[0])

		x, y := mustTensor(t, []float32{float32(i)}), mustTensor(t, make([]float32, 1))
		require.NoError(t, addOne.Call(*x, *y)) // tensors by value
		assert.Equal(t, []float32{float32(i + 1)}, unsafe.Slice((*float32)(y.Data), 1))

		got, err := greet.CallValue(fmt.Sprint("gopher ", i))
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprint("hello, gopher ", i), got)
	}
}

// Calls while the collector runs: a frame's C block is reused, and Go must never
// leave its stale contents where the collector looks (a pointer-typed store there
// runs the write barrier on the old value). Mixed frame sizes, fresh Go memory,
// tensors past the directly passed ones, value tensors, strings.
func TestCallsUnderGC(t *testing.T) {
	addOne, sum9 := openFunc(t, "add_one"), openFunc(t, "sum9")
	greet := openFuncIn(t, ffiLib, "greet")
	stop := make(chan struct{})
	collector := make(chan struct{})
	go func() {
		defer close(collector)
		for {
			select {
			case <-stop:
				return
			default:
				runtime.GC()
			}
		}
	}()
	err := inParallel(8, func(g int) error {
		for i := range 600 {
			n := 1 + (g+i)%17
			out := make([]float32, n)
			if err := addOne.Call(vector(make([]float32, n)), vector(out)); err != nil || out[n-1] != 1 {
				return fmt.Errorf("add_one: %v, %v", err, out)
			}
			xs := make([]any, 10)
			for k := range 9 {
				xs[k] = *vector([]float32{1}) // by value
			}
			sum := make([]float32, 1)
			xs[9] = vector(sum)
			if err := sum9.Call(xs...); err != nil || sum[0] != 45 {
				return fmt.Errorf("sum9: %v, %v", err, sum)
			}
			if got, err := greet.CallValue("gc"); err != nil || got != "hello, gc" {
				return fmt.Errorf("greet: %v, %v", err, got)
			}
		}
		return nil
	})
	close(stop)
	<-collector
	require.NoError(t, err)
}

func TestBadArguments(t *testing.T) {
	f := openFuncIn(t, ffiLib, "add_int")
	tests := []struct {
		name    string
		args    []any
		msg     string
		tvmKind string // "" for arguments dsoop refuses before the call
	}{
		{"unsupported Go type", []any{struct{}{}, 1}, "argument 0 has type struct {}", ""},
		{"uint64 overflow", []any{uint64(1 << 63), 1}, "argument 0 has type uint64", ""},
		{"nil tensor", []any{(*dlpack.Tensor)(nil)}, "argument 0 is a nil tensor", ""},
		{"strides not matching the shape", []any{1, &dlpack.Tensor{DType: dlpack.Float32, Shape: []int64{2, 3}, Strides: []int64{3}}},
			"argument 1 has 1 strides for 2 dimensions", ""},
		{"wrong count", []any{int64(1)}, "Expected 2 but got 1 arguments", "TypeError"},
		{"wrong type for TVM", []any{"one", 2}, "Mismatched type on argument #0", "TypeError"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.CallValue(tc.args...)
			require.ErrorContains(t, err, tc.msg)
			assert.Contains(t, err.Error(), "dsoop: add_int in "+ffiLib, "the error names the function and library")
			var tvmErr *dsoop.Error
			if tc.tvmKind == "" {
				assert.False(t, errors.As(err, &tvmErr), "refused before TVM saw it")
				return
			}
			require.ErrorAs(t, err, &tvmErr)
			assert.Equal(t, tc.tvmKind, tvmErr.Kind)
		})
	}
}

func TestCallOnSetsAndRestoresTheStream(t *testing.T) {
	// No GPU here: a stand-in CUstream (any address) is only stored and read
	// back, never used, and TVM holds it only during the call.
	cuda := dlpack.Device{Type: dlpack.CUDA, ID: 0}
	var marker byte
	fakeStream := unsafe.Pointer(&marker)
	probe := openFuncIn(t, ffiLib, "current_stream")
	seen := make([]int64, 1)
	seenTensor := mustTensor(t, seen)
	deviceArgs := []any{int64(cuda.Type), int64(cuda.ID)}

	require.NoError(t, probe.CallOn(cuda, fakeStream, append([]any{seenTensor}, deviceArgs...)...))
	assert.Equal(t, int64(uintptr(fakeStream)), seen[0], "the function sees the caller's stream")
	require.NoError(t, probe.Call(append([]any{seenTensor}, deviceArgs...)...))
	assert.Equal(t, int64(0), seen[0], "the previous stream is restored")

	out := make([]float32, 2)
	err := openFuncIn(t, ffiLib, "raise_value_error").CallOn(cuda, fakeStream, mustTensor(t, out), mustTensor(t, out))
	var tvmErr *dsoop.Error
	require.ErrorAs(t, err, &tvmErr)
	assert.Equal(t, "ValueError", tvmErr.Kind)
	require.NoError(t, probe.Call(append([]any{seenTensor}, deviceArgs...)...))
	assert.Equal(t, int64(0), seen[0], "restored after a failing call too")

	require.NoError(t, openFuncIn(t, ffiLib, "fill").CallOn(dlpack.Device{Type: dlpack.CPU}, nil, mustTensor(t, out), 4.0))
	assert.Equal(t, []float32{4, 4}, out)
}

func TestForeignMemory(t *testing.T) {
	// Memory Go does not own (here mmap'ed) goes to TVM as it is.
	mem, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	require.NoError(t, err)
	defer syscall.Munmap(mem)
	in := unsafe.Slice((*float32)(unsafe.Pointer(&mem[0])), 4)
	out := unsafe.Slice((*float32)(unsafe.Pointer(&mem[64])), 4)
	copy(in, []float32{1, 2, 3, 4})
	x := &dlpack.Tensor{Data: unsafe.Pointer(&mem[0]), Device: dlpack.Device{Type: dlpack.CPU}, DType: dlpack.Float32, Shape: []int64{4}}
	y := &dlpack.Tensor{Data: unsafe.Pointer(&mem[64]), Device: dlpack.Device{Type: dlpack.CPU}, DType: dlpack.Float32, Shape: []int64{4}}
	require.NoError(t, openFunc(t, "add_one").Call(x, y))
	assert.Equal(t, []float32{2, 3, 4, 5}, out)
}

func TestFunctionErrorsCarryTVMKind(t *testing.T) {
	tests := []struct{ fn, kind, msg string }{
		{"raise_value_error", "ValueError", "deliberate failure"},
		{"raise_runtime_error", "RuntimeError", "deliberate runtime failure"},
	}
	for _, tc := range tests {
		t.Run(tc.fn, func(t *testing.T) {
			x := mustTensor(t, []float32{1})
			err := openFuncIn(t, ffiLib, tc.fn).Call(x, x)
			var tvmErr *dsoop.Error
			require.ErrorAs(t, err, &tvmErr)
			assert.Equal(t, tc.kind, tvmErr.Kind)
			assert.Contains(t, tvmErr.Message, tc.msg)
		})
	}
}

func TestConcurrentCalls(t *testing.T) {
	f := openFunc(t, "add_one")
	require.NoError(t, inParallel(16, func(g int) error {
		for i := range 200 {
			out := make([]float32, 2)
			if err := f.Call(vector([]float32{float32(g), float32(i)}), vector(out)); err != nil {
				return err
			}
			if out[0] != float32(g)+1 || out[1] != float32(i)+1 {
				return fmt.Errorf("goroutine %d call %d: got %v", g, i, out)
			}
		}
		return nil
	}))
}

// TestDataSymbolIsNotAFunction: TVM's loader finds any __tvm_ffi_<name> symbol
// and would wrap data as a function; a call would jump into it.
func TestDataSymbolIsNotAFunction(t *testing.T) {
	m, err := dsoop.Open(ffiLib)
	require.NoError(t, err)
	defer m.Close()
	_, err = m.Func("not_code")
	require.ErrorIs(t, err, dsoop.ErrNotCode)
	require.ErrorIs(t, err, dsoop.ErrFunctionNotFound)
	f, err := m.Func("add_int") // the functions beside it still resolve
	require.NoError(t, err)
	f.Close()
}

// TestReservedNamesAreRefused: a name TVM keeps for its own symbols is refused
// before any lookup, with an error of its own; in a whole model's library,
// "_library_bin" reaches the embedded modules, and was refused as data before.
func TestReservedNamesAreRefused(t *testing.T) {
	model := filepath.Join(modelsDir, "mlp.so")
	tests := []struct {
		lib, name string
		want      error
	}{
		{model, "_library_bin", dsoop.ErrReservedName},
		{testLib, "_library_ctx", dsoop.ErrReservedName},
		{ffiLib, "_metadata_add_int", dsoop.ErrReservedName},
		{ffiLib, "__tvm_main__", dsoop.ErrReservedName},
		{testLib, "main", dsoop.ErrFunctionNotFound}, // looked up: a library may export it
		{ffiLib, "not_code", dsoop.ErrNotCode},
	}
	for _, tc := range tests {
		t.Run(filepath.Base(tc.lib)+"/"+tc.name, func(t *testing.T) {
			m, err := dsoop.Open(tc.lib)
			require.NoError(t, err)
			defer m.Close()
			_, err = m.Func(tc.name)
			require.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), tc.name)
			if tc.want == dsoop.ErrReservedName {
				assert.NotErrorIs(t, err, dsoop.ErrFunctionNotFound, "a reserved name is a bad argument, not a missing function")
			}
		})
	}
}
