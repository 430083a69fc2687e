package dsoop_test

import (
	"fmt"
	"math"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

var cpu = dlpack.Device{Type: dlpack.CPU}

func openModel(t *testing.T, lib, name string) *dsoop.VMFunc {
	t.Helper()
	m, err := dsoop.Open(lib)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	require.True(t, m.IsVM(), "%s should hold a Relax VM executable", lib)
	f, err := m.VMFunc(name, cpu)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	return f
}

// floats reads a returned float32 tensor.
func floats(t *testing.T, tensor *dlpack.Tensor) []float32 {
	t.Helper()
	require.Equal(t, dlpack.Float32, tensor.DType)
	n := int(tensor.NumElements())
	return unsafe.Slice((*float32)(unsafe.Add(tensor.Data, tensor.ByteOffset)), n)
}

func TestVMReturnsNestedTuplesFlattened(t *testing.T) {
	f := openModel(t, modelsDir+"/two_outputs.so", "main")
	assert.Equal(t, 1, f.Arity())
	x := []float32{0, 1, 2, 3, 4, 5, 6, 7}
	out, err := f.Call(mustTensor(t, x, 2, 4))
	require.NoError(t, err)
	defer out.Close()
	require.Len(t, out.Tensors, 3)
	assert.Equal(t, []int64{2, 4}, out.Tensors[0].Shape)
	assert.Equal(t, []float32{1, 2, 3, 4, 5, 6, 7, 8}, floats(t, out.Tensors[0]))
	assert.Equal(t, []float32{0, 2, 4, 6, 8, 10, 12, 14}, floats(t, out.Tensors[1]))
	assert.Equal(t, []int64{2}, out.Tensors[2].Shape)
	assert.Equal(t, []float32{6, 22}, floats(t, out.Tensors[2]))
}

// mlpParams are deterministic weights for mlp.so (Linear(16, 32), ReLU,
// Linear(32, 8); nn.Linear keeps weights as [out, in]).
func mlpParams() [][]float32 {
	shapes := []int{32 * 16, 32, 8 * 32, 8}
	params := make([][]float32, len(shapes))
	for p, n := range shapes {
		params[p] = make([]float32, n)
		for i := range params[p] {
			params[p][i] = float32(math.Sin(float64(7*p+i))) / 4
		}
	}
	return params
}

// mlpReference is the MLP in plain Go.
func mlpReference(x []float32, batch int, params [][]float32) []float32 {
	w1, b1, w2, b2 := params[0], params[1], params[2], params[3]
	out := make([]float32, batch*8)
	for b := 0; b < batch; b++ {
		hidden := make([]float32, 32)
		for o := range hidden {
			sum := b1[o]
			for i := 0; i < 16; i++ {
				sum += x[b*16+i] * w1[o*16+i]
			}
			hidden[o] = max(sum, 0)
		}
		for o := 0; o < 8; o++ {
			sum := b2[o]
			for i := 0; i < 32; i++ {
				sum += hidden[i] * w2[o*32+i]
			}
			out[b*8+o] = sum
		}
	}
	return out
}

// TestVMMLPWithParamsAsInputsAtSeveralBatchSizes runs the MLP as bytecode
// (mlp.so) and compiled to native code (mlp_native.so, as tf_op.compile builds).
func TestVMMLPWithParamsAsInputsAtSeveralBatchSizes(t *testing.T) {
	for _, lib := range []string{"mlp.so", "mlp_native.so"} {
		t.Run(lib, func(t *testing.T) { testMLPBatches(t, openModel(t, filepath.Join(modelsDir, lib), "forward")) })
	}
}

func testMLPBatches(t *testing.T, f *dsoop.VMFunc) {
	assert.Equal(t, 5, f.Arity())
	params := mlpParams()
	for _, batch := range []int{1, 3, 8} {
		t.Run(fmt.Sprint("batch ", batch), func(t *testing.T) {
			x := make([]float32, batch*16)
			for i := range x {
				x[i] = float32(math.Cos(float64(i)))
			}
			out, err := f.Call(mustTensor(t, x, int64(batch), 16), mustTensor(t, params[0], 32, 16),
				mustTensor(t, params[1], 32), mustTensor(t, params[2], 8, 32), mustTensor(t, params[3], 8))
			require.NoError(t, err)
			defer out.Close()
			require.Len(t, out.Tensors, 1)
			assert.Equal(t, []int64{int64(batch), 8}, out.Tensors[0].Shape)
			assert.InDeltaSlice(t, mlpReference(x, batch, params), floats(t, out.Tensors[0]), 1e-5)
		})
	}
}

func TestVMCallsFromManyGoroutines(t *testing.T) {
	f := openModel(t, modelsDir+"/two_outputs.so", "main")
	require.NoError(t, inParallel(8, func(g int) error {
		for i := range 50 {
			base := float32(g*1000 + i)
			x, err := dlpack.FromSlice([]float32{base, base + 1, base + 2, base + 3}, 1, 4)
			if err != nil {
				return err
			}
			out, err := f.Call(x)
			if err != nil {
				return fmt.Errorf("goroutine %d call %d: %w", g, i, err)
			}
			sum := out.Tensors[2]
			got := *(*float32)(unsafe.Add(sum.Data, sum.ByteOffset))
			out.Close()
			if want := 4*base + 6; sum.DType != dlpack.Float32 || got != want {
				return fmt.Errorf("goroutine %d call %d: sum %v (%v), want %v", g, i, got, sum.DType, want)
			}
		}
		return nil
	}))
}

// TestVMFunctionsFromTheFunctionTable: the model's functions, read from the
// executable's function table without TVM (which decodes every instruction for
// its text form, and can crash on a corrupted one), are those of TVM's text form.
func TestVMFunctionsFromTheFunctionTable(t *testing.T) {
	tests := []struct {
		lib  string
		want []string
	}{
		{"mlp.so", []string{"forward"}},
		{"mlp_native.so", []string{"forward"}},
		{"two_outputs.so", []string{"main"}},
		{"onnx_model.so", []string{"main"}},
	}
	for _, tc := range tests {
		t.Run(tc.lib, func(t *testing.T) {
			m, err := dsoop.Open(filepath.Join(modelsDir, tc.lib))
			require.NoError(t, err)
			defer m.Close()
			table, text, err := dsoop.VMFunctionTables(m)
			require.NoError(t, err)
			assert.Equal(t, tc.want, table)
			assert.Equal(t, text, table)
			names, err := m.VMFunctions()
			require.NoError(t, err)
			assert.Equal(t, tc.want, names)
		})
	}
}

func TestVMErrors(t *testing.T) {
	m, err := dsoop.Open(modelsDir + "/two_outputs.so")
	require.NoError(t, err)
	defer m.Close()

	_, err = m.VMFunc("nope", cpu)
	require.ErrorIs(t, err, dsoop.ErrFunctionNotFound)
	assert.Contains(t, err.Error(), "the model's functions are main")
	for _, method := range []string{"vm_initialization", "get_function_arity", "add"} {
		_, err = m.VMFunc(method, cpu)
		require.ErrorIs(t, err, dsoop.ErrFunctionNotFound, "%s is not a model function", method)
	}

	f, err := m.VMFunc("main", cpu)
	require.NoError(t, err)
	defer f.Close()
	_, err = f.Call()
	require.ErrorIs(t, err, dsoop.ErrArity)
	assert.Contains(t, err.Error(), "takes 1, got 0")

	// The VM checks shapes itself; its error comes back with its kind.
	_, err = f.Call(mustTensor(t, make([]float32, 10), 2, 5))
	var tvmErr *dsoop.Error
	require.ErrorAs(t, err, &tvmErr)
	assert.Contains(t, tvmErr.Message, "mismatch")

	// A library of plain functions is no model.
	plain, err := dsoop.Open(testLib)
	require.NoError(t, err)
	defer plain.Close()
	assert.False(t, plain.IsVM())
	_, err = plain.VMFunc("add_one", cpu)
	assert.ErrorContains(t, err, "holds no whole model: call its functions with Func")
}

func TestVMPoolIsBounded(t *testing.T) {
	t.Setenv(dsoop.VMInstancesEnv, "2")
	f := openModel(t, modelsDir+"/two_outputs.so", "main")
	x := mustTensor(t, []float32{1, 2, 3, 4}, 1, 4) // read only: shared by the calls
	require.NoError(t, inParallel(8, func(int) error {
		for range 20 {
			out, err := f.Call(x)
			if err != nil {
				return err
			}
			out.Close()
		}
		return nil
	}))
	// How many were needed depends on how the calls overlapped; never more than 2.
	assert.LessOrEqual(t, f.Instances(), 2, "8 goroutines share at most 2 VM instances")
	assert.GreaterOrEqual(t, f.Instances(), 1)

	t.Setenv(dsoop.VMInstancesEnv, "0")
	m, err := dsoop.Open(modelsDir + "/mlp.so")
	require.NoError(t, err)
	defer m.Close()
	_, err = m.VMFunc("forward", cpu)
	assert.ErrorContains(t, err, dsoop.VMInstancesEnv+`="0": want a number of VM instances`)
}
