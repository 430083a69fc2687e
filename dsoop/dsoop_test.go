package dsoop_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// testLib is the library of test functions built by tests/modules/build_modules.py.
var testLib string

// TestMain builds the test functions with apache-tvm, in the project's venv (or
// the Python named by TVMDSOOP_PYTHON). `make test` sets up both the venv and
// TVM_LIBRARY_PATH.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dsoop-test")
	if err != nil {
		panic(err)
	}
	python := os.Getenv("TVMDSOOP_PYTHON")
	if python == "" {
		python = "../.venv/bin/python"
	}
	cmd := exec.Command(python, "../tests/modules/build_modules.py", dir)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "building the test modules with %s failed (run `make test`): %v\n", python, err)
		os.Exit(1)
	}
	testLib = filepath.Join(dir, "testfuncs.so")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func mustTensor[T dlpack.Element](t *testing.T, data []T, shape ...int64) *dlpack.Tensor {
	t.Helper()
	tensor, err := dlpack.FromSlice(data, shape...)
	require.NoError(t, err)
	return tensor
}

func openFunc(t *testing.T, name string) *dsoop.Func {
	t.Helper()
	m, err := dsoop.Open(testLib)
	require.NoError(t, err)
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
			require.NoError(t, f.Call(append(tc.inputs(t), outTensor)...))
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
		require.Error(t, err)
		assert.Contains(t, err.Error(), path)
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
		assert.Error(t, f.Call(mustTensor(t, []float32{1}), mustTensor(t, make([]float32, 1))))
	})
}

func TestOpenSharesModules(t *testing.T) {
	a, err := dsoop.Open(testLib)
	require.NoError(t, err)
	t.Chdir(filepath.Dir(testLib))
	b, err := dsoop.Open(filepath.Base(testLib))
	require.NoError(t, err)
	assert.Same(t, a, b)
	assert.Equal(t, testLib, a.Path())
}

func TestConcurrentCalls(t *testing.T) {
	f := openFunc(t, "add_one")
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				in := []float32{float32(g), float32(i)}
				out := make([]float32, 2)
				if err := f.Call(mustTensor(t, in), mustTensor(t, out)); err != nil {
					errs <- err
					return
				}
				if out[0] != float32(g)+1 || out[1] != float32(i)+1 {
					errs <- fmt.Errorf("goroutine %d call %d: got %v", g, i, out)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
