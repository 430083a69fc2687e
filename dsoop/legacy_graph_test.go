package dsoop_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
	"github.com/tvmdsoop/tvmdsoop/dsoop"
	"github.com/tvmdsoop/tvmdsoop/internal/testenv"
)

// legacyValues generates the fixtures' inputs and MobileNet's params, as
// fixtures.py did for TVM 0.18's reference outputs.
var legacyValues = testenv.LegacyValues

// legacyScale is fixtures.py's legacy_scale: weights scaled by their fan-in.
func legacyScale(shape []int64) float64 {
	fanIn := int64(1)
	for _, d := range shape[min(1, len(shape)):] {
		fanIn *= d
	}
	if len(shape) > 1 && fanIn > 1 {
		return math.Sqrt(3 / float64(fanIn))
	}
	return 0.1
}

// legacyGraphJSON is what the tests read of a graph: its inputs' names and shapes.
type legacyGraphJSON struct {
	Nodes []struct {
		Name string `json:"name"`
	} `json:"nodes"`
	ArgNodes   []int `json:"arg_nodes"`
	NodeRowPtr []int `json:"node_row_ptr"`
	Attrs      struct {
		Shape []json.RawMessage `json:"shape"`
	} `json:"attrs"`
}

// graphInputs lists a graph's inputs with their shapes, in graph order.
func graphInputs(t testing.TB, graph []byte) (names []string, shapes [][]int64) {
	t.Helper()
	var g legacyGraphJSON
	require.NoError(t, json.Unmarshal(graph, &g))
	var all [][]int64
	require.Len(t, g.Attrs.Shape, 2)
	require.NoError(t, json.Unmarshal(g.Attrs.Shape[1], &all))
	for _, nid := range g.ArgNodes {
		names = append(names, g.Nodes[nid].Name)
		shapes = append(shapes, all[g.NodeRowPtr[nid]])
	}
	return names, shapes
}

// paramBlob writes float32 params as relay.save_param_dict does
// (file_utils.cc, SaveParams; SaveDLTensor).
func paramBlob(names []string, shapes [][]int64, values [][]float32) []byte {
	var b bytes.Buffer
	w := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	str := func(s string) { w(uint64(len(s))); b.WriteString(s) }
	w(uint64(0xF7E58D4F05049CB7))
	w(uint64(0))
	w(uint64(len(names)))
	for _, n := range names {
		str(n)
	}
	w(uint64(len(names)))
	for i := range names {
		w(uint64(0xDD5E40F096B4A13F))
		w(uint64(0))
		w([2]int32{int32(dlpack.CPU), 0})
		w(int32(len(shapes[i])))
		w([4]uint8{uint8(dlpack.Float), 32, 1, 0})
		w(shapes[i])
		w(int64(4 * len(values[i])))
		w(values[i])
	}
	return b.Bytes()
}

// generatedParams are the params fixtures.py generates for a graph: every
// input but "data".
func generatedParams(t testing.TB, graph []byte) []byte {
	t.Helper()
	names, shapes := graphInputs(t, graph)
	var pn []string
	var ps [][]int64
	var pv [][]float32
	for i, name := range names {
		if name == "data" {
			continue
		}
		n := int64(1)
		for _, d := range shapes[i] {
			n *= d
		}
		pn, ps, pv = append(pn, name), append(ps, shapes[i]), append(pv, legacyValues(name, int(n), legacyScale(shapes[i])))
	}
	return paramBlob(pn, ps, pv)
}

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(legacyFixtures, name))
	require.NoError(t, err)
	return data
}

// referenceOutput is TVM 0.18's graph executor's output i of the model on
// the generated data.
func referenceOutput(t testing.TB, model string, i int) []float32 {
	t.Helper()
	raw := readFixture(t, model+".out"+string(rune('0'+i)))
	out := make([]float32, len(raw)/4)
	require.NoError(t, binary.Read(bytes.NewReader(raw), binary.LittleEndian, out))
	return out
}

// openGraphModel opens a fixture's model: one file (lib alone), or its
// library with the graph and params.
func openGraphModel(t *testing.T, lib string, graph, params []byte) *dsoop.Module {
	t.Helper()
	m, err := dsoop.OpenPinned(filepath.Join(legacyFixtures, lib), legacyDigests(t)[lib])
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	if graph == nil {
		return m
	}
	model, err := m.Graph(graph, params)
	require.NoError(t, err)
	t.Cleanup(func() { model.Close() })
	return model
}

func assertClose(t *testing.T, want, got []float32) {
	t.Helper()
	require.Len(t, got, len(want))
	for i := range want {
		require.InDelta(t, want[i], got[i], 1e-5+1e-4*math.Abs(float64(want[i])), "element %d", i)
	}
}

// graphModelCase is one of the fixtures' graph models, as its forms open it.
type graphModelCase struct {
	name, model string
	open        func(t *testing.T) *dsoop.Module
	data        []int64 // the input's shape
	outputs     [][]int64
}

func graphModelCases() []graphModelCase {
	return []graphModelCase{
		{
			name: "convnet, one file (factory module)", model: "convnet",
			open:    func(t *testing.T) *dsoop.Module { return openGraphModel(t, "convnet.so", nil, nil) },
			data:    []int64{1, 3, 16, 16},
			outputs: [][]int64{{1, 10}, {1, 8}},
		},
		{
			name: "convnet, three files", model: "convnet",
			open: func(t *testing.T) *dsoop.Module {
				return openGraphModel(t, "convnet_lib.so", readFixture(t, "convnet.json"), readFixture(t, "convnet.params"))
			},
			data:    []int64{1, 3, 16, 16},
			outputs: [][]int64{{1, 10}, {1, 8}},
		},
		{
			name: "mobilenet, three files (generated params)", model: "mobilenet",
			open: func(t *testing.T) *dsoop.Module {
				graph := readFixture(t, "mobilenet.json")
				return openGraphModel(t, "mobilenet_lib.so", graph, generatedParams(t, graph))
			},
			data:    []int64{1, 3, 224, 224},
			outputs: [][]int64{{1, 1000}},
		},
	}
}

func numElements(shape []int64) int {
	n := 1
	for _, d := range shape {
		n *= int(d)
	}
	return n
}

func TestLegacyGraphModelsMatchTVM(t *testing.T) {
	for _, tc := range graphModelCases() {
		t.Run(tc.name, func(t *testing.T) {
			m := tc.open(t)
			require.True(t, m.IsModel())
			functions, err := m.Functions()
			require.NoError(t, err)
			assert.Equal(t, []string{"default"}, functions)
			f, err := m.VMFunc("default", cpu)
			require.NoError(t, err)
			defer f.Close()
			assert.Equal(t, 1, f.Arity(), "the params are not inputs")
			data := legacyValues("data", numElements(tc.data), 1)
			out, err := f.Call(mustTensor(t, data, tc.data...))
			require.NoError(t, err)
			defer out.Close()
			require.Len(t, out.Tensors, len(tc.outputs))
			for i, shape := range tc.outputs {
				assert.Equal(t, shape, out.Tensors[i].Shape)
				assertClose(t, referenceOutput(t, tc.model, i), floats(t, out.Tensors[i]))
			}
		})
	}
}

// Calls at once run on instances of their own: none sees another's tensors.
func TestLegacyGraphConcurrentCalls(t *testing.T) {
	t.Setenv(dsoop.VMInstancesEnv, "3")
	m := graphModelCases()[0].open(t)
	f, err := m.VMFunc("default", cpu)
	require.NoError(t, err)
	defer f.Close()
	data := legacyValues("data", 3*16*16, 1)
	want := referenceOutput(t, "convnet", 0)
	// Another input, whose outputs differ: a call that saw another's storage shows.
	zeros := make([]float32, len(data))
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	results := make([][]float32, 16)
	for g := range 16 {
		wg.Go(func() {
			in := data
			if g%2 == 1 {
				in = zeros
			}
			tensor, err := dlpack.FromSlice(in, 1, 3, 16, 16)
			if err != nil {
				errs <- err
				return
			}
			for range 20 {
				out, err := f.Call(tensor)
				if err != nil {
					errs <- err
					return
				}
				results[g] = slices.Clone(unsafe32(out.Tensors[0]))
				out.Close()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for g := 0; g < 16; g += 2 {
		assertClose(t, want, results[g])
	}
	for g := 1; g < 16; g += 2 {
		assert.Equal(t, results[1], results[g])
		assert.NotEqual(t, want, results[g])
	}
	assert.LessOrEqual(t, f.Instances(), 3)
}

func TestLegacyGraphRefusesBadInputs(t *testing.T) {
	m := graphModelCases()[0].open(t)
	f, err := m.VMFunc("default", cpu)
	require.NoError(t, err)
	defer f.Close()
	tests := []struct {
		name  string
		input *dlpack.Tensor
		want  string
	}{
		{"shape", mustTensor(t, make([]float32, 3*16*16), 3, 16, 16), "input 'data' must have shape [1, 3, 16, 16], got [3, 16, 16]"},
		{"dtype", mustTensor(t, make([]int32, 3*16*16), 1, 3, 16, 16), "input 'data' must be float32, got int32"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.Call(tc.input)
			var tvmErr *dsoop.Error
			require.ErrorAs(t, err, &tvmErr)
			assert.Equal(t, "ValueError", tvmErr.Kind)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err = f.Call()
	require.ErrorIs(t, err, dsoop.ErrArity)
	// CPU only: a relay.build model on another device is unimplemented, not tried.
	_, err = m.VMFunc("default", dlpack.Device{Type: dlpack.CUDA})
	require.ErrorIs(t, err, dsoop.ErrLegacyUnsupported)
}

// Corrupted graphs and params are refused with an error before anything runs.
func TestLegacyGraphRefusesCorruptFiles(t *testing.T) {
	var compact bytes.Buffer
	require.NoError(t, json.Compact(&compact, readFixture(t, "convnet.json")))
	graph := compact.Bytes()
	params := readFixture(t, "convnet.params")
	replace := func(old, new string) []byte {
		require.Contains(t, string(graph), old)
		return bytes.Replace(graph, []byte(old), []byte(new), 1)
	}
	tests := []struct {
		name          string
		graph, params []byte
		want          string
		unsupported   bool
	}{
		{name: "not JSON", graph: graph[:len(graph)/2], params: params, want: "graph JSON"},
		{name: "unknown kernel", graph: replace(`"func_name":"tvmgen_default_fused_nn_global_avg_pool2d"`, `"func_name":"system"`), params: params, want: "does not export"},
		{name: "entry out of range", graph: replace(`"inputs":[[6,0,0]]`, `"inputs":[[60,0,0]]`), params: params, want: "not an output of a node before it"},
		{name: "node reads a later one", graph: replace(`"inputs":[[6,0,0]]`, `"inputs":[[8,0,0]]`), params: params, want: "not an output of a node before it"},
		{name: "huge shape", graph: replace(`[1,3,16,16]`, `[1,3,16,1099511627776]`), params: params, want: "more than"},
		{name: "CUDA entries", graph: replace(`"device_index":["list_int",[1,`, `"device_index":["list_int",[2,`), params: params, want: "CPU only", unsupported: true},
		{name: "other node kind", graph: replace(`"op":"tvm_op"`, `"op":"tvm_closure"`), params: params, want: `"tvm_closure"`, unsupported: true},
		{name: "truncated params", graph: graph, params: params[:len(params)-3], want: "params"},
		{name: "not params", graph: graph, params: []byte("not a param blob at all"), want: "not a TVM param blob"},
		{name: "param of another shape", graph: graph, params: paramBlob([]string{"p0"}, [][]int64{{2}}, [][]float32{{1, 2}}), want: `"p0" is a`},
	}
	lib := openGraphModel(t, "convnet_lib.so", nil, nil)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := lib.Graph(tc.graph, tc.params)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, tc.unsupported, errors.Is(err, dsoop.ErrLegacyUnsupported))
		})
	}
}

// GraphFiles reads the two files pinned to their digests, before anything runs.
func TestLegacyGraphFilesArePinned(t *testing.T) {
	lib := openGraphModel(t, "convnet_lib.so", nil, nil)
	graph, params := filepath.Join(legacyFixtures, "convnet.json"), filepath.Join(legacyFixtures, "convnet.params")
	digests := legacyDigests(t)
	model, err := lib.GraphFiles(graph, digests["convnet.json"], params, digests["convnet.params"])
	require.NoError(t, err)
	defer model.Close()
	assert.True(t, model.IsModel())
	_, err = lib.GraphFiles(graph, digests["convnet.json"], params, digests["convnet.json"])
	require.ErrorIs(t, err, dsoop.ErrDigestMismatch)
	assert.Contains(t, err.Error(), "convnet.params")
}

func TestInspectRelayBuildModel(t *testing.T) {
	in, err := dsoop.Inspect(filepath.Join(legacyFixtures, "convnet.so"))
	require.NoError(t, err)
	assert.Equal(t, dsoop.KindModel, in.Kind)
	assert.Equal(t, "0.8-0.20", in.TVM)
	assert.Equal(t, []string{"default"}, in.Functions)
	assert.Equal(t, []dsoop.InspectedModule{{Kind: "GraphExecutorFactory"}}, in.Embedded)
}

// A library with an imported module (import_module) runs its functions.
func TestLegacyImportModuleLibrary(t *testing.T) {
	m := openLegacy(t, "imported.so")
	assert.False(t, m.IsModel())
	for _, tc := range []struct {
		fn     string
		input  *dlpack.Tensor
		expect []float32
	}{
		{"add_one", mustTensor(t, []float32{1, 2}), []float32{2, 3}},
		{"row_sum", mustTensor(t, []float32{1, 2, 3, 4}, 2, 2), []float32{3, 7}},
	} {
		f, err := m.Func(tc.fn)
		require.NoError(t, err, tc.fn)
		got := callInto[float32](t, f, 2, nil, tc.input)
		f.Close()
		assert.Equal(t, tc.expect, got, tc.fn)
	}
}

func unsafe32(t *dlpack.Tensor) []float32 {
	return unsafe.Slice((*float32)(unsafe.Add(t.Data, t.ByteOffset)), int(t.NumElements()))
}
