package tfbridge_test

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tvmdsoop/tvmdsoop/auto"
	"github.com/tvmdsoop/tvmdsoop/internal/testenv"
	"github.com/tvmdsoop/tvmdsoop/tfbridge"
)

// testLib is tests/modules' testfuncs.so; savedModelDir a SavedModel exported
// from Python with tf_op (tests/modules/export_saved_model.py); modelsDir the
// whole models of tests/modules/build_models.py; convertedDir a SavedModel
// that tf_op.auto.convert compiled ahead (tests/modules/export_converted_model.py).
var testLib, savedModelDir, modelsDir, convertedDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tfbridge-test")
	if err != nil {
		panic(err)
	}
	for _, args := range [][]string{
		{"tests/modules/build_modules.py", dir},
		{"tests/modules/export_saved_model.py", filepath.Join(dir, "testfuncs.so"), dir},
		{"tests/modules/build_models.py", filepath.Join(dir, "models")},
		{"tests/modules/export_converted_model.py", filepath.Join(dir, "converted")},
	} {
		if err := testenv.RunPython("..", args[0], args[1:]...); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	testLib, savedModelDir, modelsDir = filepath.Join(dir, "testfuncs.so"), dir, filepath.Join(dir, "models")
	convertedDir = filepath.Join(dir, "converted")
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
		inputs int       // the node's: x, output_dims only when sizes come at run time, library
		want   []any
	}{
		{
			name:   "static shape",
			fn:     "transpose",
			opts:   []tfbridge.Option{tfbridge.WithOutputs(tfbridge.Output{Shape: []int64{3, 2}})},
			shapes: [][]int64{{3, 2}},
			inputs: 2,
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
			inputs: 3,
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
			inputs: 2,
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
			assert.Equal(t, tc.inputs, outs[0].Op.NumInputs())
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

// TestInplace chains two calls of a function that writes x+1 and notes the
// addresses of its input and output: with WithInplace the second call writes
// over the first's output, which nothing else uses; the fed input, which the
// caller holds, is never written over.
func TestInplace(t *testing.T) {
	tests := []struct {
		name          string
		opts          []tfbridge.Option
		secondInPlace bool
	}{
		{"declared", []tfbridge.Option{tfbridge.WithInplace(map[int]int{0: 0})}, true},
		{"not declared", nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := tfbridge.NewModule(filepath.Join(filepath.Dir(testLib), "ffifuncs.so"))
			require.NoError(t, err)
			opts := append([]tfbridge.Option{tfbridge.WithOutputs(tfbridge.Output{}, tfbridge.Output{DType: tf.Int64, Shape: []int64{2}})}, tc.opts...)
			f, err := m.Func("add_one_noting_buffers", opts...)
			require.NoError(t, err)
			s := op.NewScope()
			x := op.Placeholder(s, tf.Float, op.PlaceholderShape(tf.MakeShape(64)))
			first := f.Call(s, x)
			second := f.Call(s, first[0])
			require.NoError(t, s.Err())
			input := make([]float32, 64)
			out, err := run(t, s, x, input, second[0], first[1], second[1])
			require.NoError(t, err)
			for i, v := range out[0].Value().([]float32) {
				require.Equal(t, float32(2), v, "element %d", i)
			}
			firstWhere, secondWhere := out[1].Value().([]int64), out[2].Value().([]int64)
			assert.NotEqual(t, firstWhere[0], firstWhere[1], "the fed input was written over")
			assert.Equal(t, tc.secondInPlace, secondWhere[0] == secondWhere[1], "addresses of input and output: %v", secondWhere)
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
			tfbridge.WithInplace(map[int]int{0: -1}),
			tfbridge.WithInplace(map[int]int{1: 0}), // one output
		} {
			_, err := m.Func("add_one", opt)
			assert.ErrorContains(t, err, "add_one")
		}
		_, err := m.Func("add_one", tfbridge.WithInplace(map[int]int{0: 0}), tfbridge.WithReturns())
		assert.ErrorContains(t, err, "returns its outputs, so none can be written over an input")
		_, err = m.Func("")
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
	t.Run("missing library", func(t *testing.T) {
		_, err := tfbridge.NewModule("/no/such/lib.so")
		require.ErrorIs(t, err, fs.ErrNotExist)
		assert.ErrorContains(t, err, "/no/such/lib.so")
	})
	t.Run("inplace names an input the call lacks", func(t *testing.T) {
		s := op.NewScope()
		x := op.Placeholder(s, tf.Float)
		assert.Nil(t, mustFunc(t, "add_one", tfbridge.WithInplace(map[int]int{0: 1})).Call(s, x))
		assert.ErrorContains(t, s.Err(), "output 0 may be written over input 1 (WithInplace), but the call has 1 input(s)")
	})
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

// TestConvertedSavedModel serves, from a copy in another folder, a SavedModel
// that tf_op.auto.convert compiled ahead: this process has no TVM compiler and
// the pass is off, and the batch it was compiled for runs TVM's library, from
// the copy's assets, with the Keras model's logits.
func TestConvertedSavedModel(t *testing.T) {
	var expected struct {
		X      []float32
		Shape  []int64
		Logits []float32
	}
	raw, err := os.ReadFile(filepath.Join(convertedDir, "expected.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &expected))
	moved := filepath.Join(t.TempDir(), "moved")
	require.NoError(t, os.CopyFS(moved, os.DirFS(filepath.Join(convertedDir, "model"))))

	model, err := tf.LoadSavedModel(moved, []string{"serve"}, nil)
	require.NoError(t, err)
	defer model.Session.Close()
	signature := model.Signatures["serving_default"]
	images, err := tf.NewTensor(expected.X)
	require.NoError(t, err)
	require.NoError(t, images.Reshape(expected.Shape))
	out, err := model.Session.Run(
		map[tf.Output]*tf.Tensor{graphOutput(t, model.Graph, signature.Inputs["images"].Name): images},
		[]tf.Output{graphOutput(t, model.Graph, signature.Outputs["logits"].Name)}, nil)
	require.NoError(t, err)
	logits := out[0].Value().([][]float32)
	require.Len(t, logits, int(expected.Shape[0]))
	for i, row := range logits {
		assert.InDeltaSlice(t, expected.Logits[i*len(row):(i+1)*len(row)], row, 1e-4)
	}

	var ran []auto.ShapeRecord
	for _, c := range auto.Report() {
		ran = append(ran, c.Shapes...)
	}
	require.NotEmpty(t, ran, "the converted model's clusters report what ran them")
	for _, shape := range ran {
		assert.Equal(t, "tvm", shape.Status, shape.Reason)
		assert.True(t, strings.HasPrefix(shape.Library, filepath.Join(moved, "assets")), shape.Library)
	}
}

// graphOutput finds "node:index" in a graph.
func graphOutput(t testing.TB, g *tf.Graph, name string) tf.Output {
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

// TestRelayBuildModel runs a relay.build model of TVM 0.18 (one file: its
// graph and params embedded) in a Go TF session, against TVM 0.18's own outputs.
func TestRelayBuildModel(t *testing.T) {
	fixtures := filepath.Join("..", "tests", "legacy", "fixtures")
	m, err := tfbridge.NewModule(filepath.Join(fixtures, "convnet.so"))
	require.NoError(t, err)
	require.True(t, m.IsModel())
	f, err := m.Func("default", tfbridge.WithOutputs(tfbridge.Output{Shape: []int64{1, 10}}, tfbridge.Output{Shape: []int64{1, 8}}))
	require.NoError(t, err)
	s := op.NewScope()
	x := op.Placeholder(s, tf.Float, op.PlaceholderShape(tf.MakeShape(1, 3, 16, 16)))
	outs := f.Call(s, x)
	require.NoError(t, s.Err())
	data := testenv.LegacyValues("data", 3*16*16, 1)
	input := make([][][][]float32, 1)
	input[0] = make([][][]float32, 3)
	for c := range 3 {
		input[0][c] = make([][]float32, 16)
		for h := range 16 {
			input[0][c][h] = data[(c*16+h)*16 : (c*16+h+1)*16]
		}
	}
	got, err := run(t, s, x, input, outs...)
	require.NoError(t, err)
	raw, err := os.ReadFile(filepath.Join(fixtures, "convnet.out0"))
	require.NoError(t, err)
	logits := got[0].Value().([][]float32)[0]
	require.Len(t, logits, len(raw)/4)
	for i, v := range logits {
		want := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		assert.InDelta(t, want, v, 1e-5+1e-4*math.Abs(float64(want)), "logit %d", i)
	}
}

// TestWholeModel runs a model compiled by TVM from relax.frontend.nn (an MLP whose
// weights are inputs) in a Go TF session, at several batch sizes through one
// graph, against the MLP computed in Go.
func TestWholeModel(t *testing.T) {
	m, err := tfbridge.NewModule(filepath.Join(modelsDir, "mlp.so"))
	require.NoError(t, err)
	require.True(t, m.IsModel())
	forward, err := m.Func("forward", tfbridge.WithOutputs(tfbridge.Output{Shape: []int64{tfbridge.DynamicDim, 8}}))
	require.NoError(t, err)

	s := op.NewScope()
	x := op.Placeholder(s.SubScope("x"), tf.Float, op.PlaceholderShape(tf.MakeShape(-1, 16)))
	shapes := [][]int64{{32, 16}, {32}, {8, 32}, {8}}
	weights := make([][]float32, len(shapes))
	inputs := []tf.Output{x}
	for p, shape := range shapes {
		n := int64(1)
		for _, d := range shape {
			n *= d
		}
		weights[p] = make([]float32, n)
		for i := range weights[p] {
			weights[p][i] = float32((p+1)*(i%7)-3) / 16
		}
		value, err := tf.NewTensor(weights[p])
		require.NoError(t, err)
		require.NoError(t, value.Reshape(shape))
		inputs = append(inputs, op.Const(s.SubScope(fmt.Sprint("p", p)), value))
	}
	y := forward.Call(s, inputs...)
	require.Len(t, y, 1)
	assert.Equal(t, []int64{-1, 8}, mustSlice(t, y[0].Shape()))
	graph, err := s.Finalize()
	require.NoError(t, err)
	session, err := tf.NewSession(graph, nil)
	require.NoError(t, err)
	defer session.Close()

	for _, batch := range []int{1, 5} {
		rows := make([][]float32, batch)
		for b := range rows {
			rows[b] = make([]float32, 16)
			for i := range rows[b] {
				rows[b][i] = float32((b*16+i)%11) / 10
			}
		}
		input, err := tf.NewTensor(rows)
		require.NoError(t, err)
		out, err := session.Run(map[tf.Output]*tf.Tensor{x: input}, y, nil)
		require.NoError(t, err)
		got := out[0].Value().([][]float32)
		require.Len(t, got, batch)
		for b := range rows {
			hidden := make([]float32, 32)
			for o := range hidden {
				sum := weights[1][o]
				for i := 0; i < 16; i++ {
					sum += rows[b][i] * weights[0][o*16+i]
				}
				hidden[o] = max(sum, 0)
			}
			for o := 0; o < 8; o++ {
				want := weights[3][o]
				for i := 0; i < 32; i++ {
					want += hidden[i] * weights[2][o*32+i]
				}
				assert.InDelta(t, want, got[b][o], 1e-4, "batch %d row %d output %d", batch, b, o)
			}
		}
	}

	// The op checks the input count against the model's.
	s = op.NewScope()
	x = op.Placeholder(s.SubScope("x"), tf.Float, op.PlaceholderShape(tf.MakeShape(-1, 16)))
	y = forward.Call(s, x)
	_, err = run(t, s, x, [][]float32{make([]float32, 16)}, y...)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "takes 5 input(s), got 1")
}
