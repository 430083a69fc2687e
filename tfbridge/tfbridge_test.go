package tfbridge_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tvmdsoop/tvmdsoop/internal/testenv"
	"github.com/tvmdsoop/tvmdsoop/tfbridge"
)

// testLib is tests/modules' testfuncs.so; savedModelDir a SavedModel exported
// from Python with tf_op (tests/modules/export_saved_model.py).
var testLib, savedModelDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tfbridge-test")
	if err != nil {
		panic(err)
	}
	for _, args := range [][]string{
		{"tests/modules/build_modules.py", dir},
		{"tests/modules/export_saved_model.py", filepath.Join(dir, "testfuncs.so"), dir},
	} {
		if err := testenv.RunPython("..", args[0], args[1:]...); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	testLib, savedModelDir = filepath.Join(dir, "testfuncs.so"), dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func mustFunc(t testing.TB, name string, opts ...tfbridge.Option) *tfbridge.Func {
	t.Helper()
	m, err := tfbridge.NewModule(testLib)
	require.NoError(t, err)
	f, err := m.Func(name, opts...)
	require.NoError(t, err)
	return f
}

// run finalises the scope's graph and fetches outputs, feeding x.
func run(t *testing.T, s *op.Scope, x tf.Output, value any, fetches ...tf.Output) ([]*tf.Tensor, error) {
	t.Helper()
	graph, err := s.Finalize()
	require.NoError(t, err)
	session, err := tf.NewSession(graph, nil)
	require.NoError(t, err)
	defer session.Close()
	input, err := tf.NewTensor(value)
	require.NoError(t, err)
	return session.Run(map[tf.Output]*tf.Tensor{x: input}, fetches, nil)
}

func TestGraphMixingTFAndTVM(t *testing.T) {
	s := op.NewScope()
	x := op.Placeholder(s, tf.Float, op.PlaceholderShape(tf.MakeShape(-1)))
	doubled := op.Mul(s, x, op.Const(s.SubScope("two"), float32(2)))
	y := mustFunc(t, "add_one").Call(s, doubled)
	require.Len(t, y, 1)
	z := op.Sum(s, y[0], op.Const(s.SubScope("axis"), int32(0)))
	assert.Equal(t, []int64{-1}, mustSlice(t, y[0].Shape()), "the shape function passes the input's shape on")

	out, err := run(t, s, x, []float32{1, 2, 3}, y[0], z)
	require.NoError(t, err)
	assert.Equal(t, []float32{3, 5, 7}, out[0].Value())
	assert.Equal(t, float32(15), out[1].Value())
}

func TestOutputs(t *testing.T) {
	matrix := [][]float32{{1, 2, 3}, {4, 5, 6}}
	tests := []struct {
		name   string
		fn     string
		opts   []tfbridge.Option
		dims   func(s *op.Scope, x tf.Output) tf.Output
		shapes [][]int64 // static shapes TF infers
		want   []any
	}{
		{
			name:   "static shape",
			fn:     "transpose",
			opts:   []tfbridge.Option{tfbridge.WithOutputs(tfbridge.Output{Shape: []int64{3, 2}})},
			shapes: [][]int64{{3, 2}},
			want:   []any{[][]float32{{1, 4}, {2, 5}, {3, 6}}},
		},
		{
			name: "dynamic shape read at run time",
			fn:   "transpose",
			opts: []tfbridge.Option{tfbridge.WithOutputs(tfbridge.Output{Shape: []int64{tfbridge.DynamicDim, tfbridge.DynamicDim}})},
			dims: func(s *op.Scope, x tf.Output) tf.Output {
				shape := op.Shape(s, x, op.ShapeOutType(tf.Int64))
				return op.ReverseV2(s, shape, op.Const(s.SubScope("axis"), []int32{0}))
			},
			shapes: [][]int64{{-1, -1}},
			want:   []any{[][]float32{{1, 4}, {2, 5}, {3, 6}}},
		},
		{
			name: "several outputs of different types",
			fn:   "two_outputs",
			opts: []tfbridge.Option{tfbridge.WithOutputs(
				tfbridge.Output{},
				tfbridge.Output{DType: tf.Double, Shape: []int64{2}},
			)},
			shapes: [][]int64{{-1, -1}, {2}},
			want:   []any{[][]float32{{2, 4, 6}, {8, 10, 12}}, []float64{6, 15}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := op.NewScope()
			x := op.Placeholder(s, tf.Float, op.PlaceholderShape(tf.MakeShape(-1, -1)))
			f := mustFunc(t, tc.fn, tc.opts...)
			var outs []tf.Output
			if tc.dims != nil {
				outs = f.CallWithDims(s, tc.dims(s, x), x)
			} else {
				outs = f.Call(s, x)
			}
			require.NoError(t, s.Err())
			require.Len(t, outs, len(tc.want))
			for i, o := range outs {
				assert.Equal(t, tc.shapes[i], mustSlice(t, o.Shape()))
			}
			got, err := run(t, s, x, matrix, outs...)
			require.NoError(t, err)
			for i, w := range tc.want {
				assert.Equal(t, w, got[i].Value())
			}
		})
	}
}

func TestLegacyTvmDsoOp(t *testing.T) {
	s := op.NewScope()
	x := op.Placeholder(s, tf.Float)
	node := s.AddOperation(tf.OpSpec{
		Type:  "TvmDsoOp",
		Input: []tf.Input{tf.OutputList{x}, op.Const(s, int64(0))},
		Attrs: map[string]interface{}{
			"lib_path":                testLib,
			"func_name":               "add_one",
			"output_dtype":            tf.Float,
			"has_static_output_shape": false,
		},
	})
	require.NoError(t, s.Err())
	out, err := run(t, s, x, []float32{1, 2}, node.Output(0))
	require.NoError(t, err)
	assert.Equal(t, []float32{2, 3}, out[0].Value())
}

func TestErrors(t *testing.T) {
	m, err := tfbridge.NewModule(testLib)
	require.NoError(t, err)
	t.Run("bad options", func(t *testing.T) {
		for _, opt := range []tfbridge.Option{
			tfbridge.WithAlignment(48),
			tfbridge.WithAlignment(0),
			tfbridge.WithOutputs(),
			tfbridge.WithOutputs(tfbridge.Output{Shape: []int64{2, -5}}),
		} {
			_, err := m.Func("add_one", opt)
			assert.ErrorContains(t, err, "add_one")
		}
		_, err := m.Func("")
		assert.Error(t, err)
	})

	runErr := func(t *testing.T, lib, fn string, input any) error {
		mod, err := tfbridge.NewModule(lib)
		require.NoError(t, err)
		f, err := mod.Func(fn)
		require.NoError(t, err)
		s := op.NewScope()
		x := op.Placeholder(s, tf.Float)
		y := f.Call(s, x)
		require.NoError(t, s.Err())
		_, err = run(t, s, x, input, y...)
		return err
	}
	tests := []struct {
		name, lib, fn string
		input         any
		msg           string
	}{
		{"missing library", "/no/such/lib.so", "add_one", []float32{1}, "/no/such/lib.so: the library file does not exist"},
		{"no such function", testLib, "nope", []float32{1}, "'nope'"},
		{"TVM rejects the shape", testLib, "add_one_4", []float32{1}, "expected 4"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := runErr(t, tc.lib, tc.fn, tc.input)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.msg)
			// The process lives on: a good graph still runs.
			require.NoError(t, runErr(t, testLib, "add_one", []float32{1}))
		})
	}
	t.Run("no input to take the output from", func(t *testing.T) {
		s := op.NewScope()
		assert.Nil(t, mustFunc(t, "add_one").Call(s))
		assert.ErrorContains(t, s.Err(), "no input")
	})
}

// TestSavedModelExportedFromPython moves the SavedModel and deletes the library
// it was built from: the model carries the library as an asset.
func TestSavedModelExportedFromPython(t *testing.T) {
	var expected struct{ X, Y, Z []float32 }
	raw, err := os.ReadFile(filepath.Join(savedModelDir, "expected.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &expected))

	moved := filepath.Join(t.TempDir(), "moved")
	require.NoError(t, os.CopyFS(moved, os.DirFS(filepath.Join(savedModelDir, "model"))))
	require.NoError(t, os.RemoveAll(filepath.Join(savedModelDir, "lib")))
	t.Chdir(t.TempDir())

	model, err := tf.LoadSavedModel(moved, []string{"serve"}, nil)
	require.NoError(t, err)
	defer model.Session.Close()
	signature := model.Signatures["serving_default"]
	input, err := tf.NewTensor(expected.X)
	require.NoError(t, err)
	feeds := map[tf.Output]*tf.Tensor{graphOutput(t, model.Graph, signature.Inputs["x"].Name): input}
	fetches := []tf.Output{
		graphOutput(t, model.Graph, signature.Outputs["y"].Name),
		graphOutput(t, model.Graph, signature.Outputs["z"].Name),
	}
	out, err := model.Session.Run(feeds, fetches, nil)
	require.NoError(t, err)
	assert.Equal(t, expected.Y, out[0].Value())
	assert.Equal(t, expected.Z, out[1].Value())
}

// graphOutput finds "node:index" in a graph.
func graphOutput(t *testing.T, g *tf.Graph, name string) tf.Output {
	t.Helper()
	node, indexText, _ := strings.Cut(name, ":")
	index := 0
	if indexText != "" {
		var err error
		index, err = strconv.Atoi(indexText)
		require.NoError(t, err)
	}
	operation := g.Operation(node)
	require.NotNil(t, operation, "no operation %q", node)
	return operation.Output(index)
}

func mustSlice(t *testing.T, s tf.Shape) []int64 {
	t.Helper()
	dims, err := s.ToSlice()
	require.NoError(t, err)
	return dims
}
