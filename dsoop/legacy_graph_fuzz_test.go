package dsoop

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

const legacyFixtureDir = "../tests/legacy/fixtures"

// legacyBlobOf is the __tvm_dev_mblob of a fixture library.
func legacyBlobOf(tb testing.TB, lib string) []byte {
	tb.Helper()
	f, err := elf.Open(filepath.Join(legacyFixtureDir, lib))
	require.NoError(tb, err)
	defer f.Close()
	symbols, err := f.DynamicSymbols()
	require.NoError(tb, err)
	for _, sym := range symbols {
		if sym.Name == legacyDevBlobSymbol {
			data, err := symbolData(f, sym)
			require.NoError(tb, err)
			blob, err := io.ReadAll(data)
			require.NoError(tb, err)
			return blob
		}
	}
	tb.Fatalf("%s has no %s", lib, legacyDevBlobSymbol)
	return nil
}

// checkGraph is what the executor relies on of a graph readGraphJSON accepts.
func checkGraph(t *testing.T, g *legacyGraph) {
	for _, e := range g.entries {
		if e.storage < 0 || e.storage >= len(g.storage) || e.bytes > g.storage[e.storage] {
			t.Fatalf("entry %+v outside its storage", e)
		}
	}
	for _, op := range g.ops {
		for _, a := range op.args {
			if a < 0 || a >= len(g.entries) {
				t.Fatalf("op %s reads entry %d of %d", op.name, a, len(g.entries))
			}
		}
	}
	for _, e := range append(g.outputs, func() (ins []int) {
		for _, in := range g.inputs {
			ins = append(ins, in.entry)
		}
		return ins
	}()...) {
		if e < 0 || e >= len(g.entries) {
			t.Fatalf("entry %d of %d", e, len(g.entries))
		}
	}
}

// FuzzReadGraphJSON: a graph's JSON is refused or read into a graph whose every
// index is in range, never a panic. The seeds (the fixtures' graphs, and
// pieces) run with every `go test`; `make fuzz` explores further.
func FuzzReadGraphJSON(f *testing.F) {
	for _, name := range []string{"convnet.json", "mobilenet.json"} {
		data, err := os.ReadFile(filepath.Join(legacyFixtureDir, name))
		require.NoError(f, err)
		f.Add(data)
		f.Add(data[:len(data)/3])
	}
	f.Add([]byte(`{"nodes":[{"op":"null","name":"x","inputs":[]}],"arg_nodes":[0],"heads":[[0,0,0]],` +
		`"node_row_ptr":[0,1],"attrs":{"dltype":["list_str",["float32"]],"storage_id":["list_int",[0]],"shape":["list_shape",[[2]]]}}`))
	f.Add([]byte(`{"nodes":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if g, err := readGraphJSON(data); err == nil {
			checkGraph(t, g)
		}
	})
}

// FuzzReadParamBlob: a param blob is refused or read into tensors whose data
// is exactly their bytes.
func FuzzReadParamBlob(f *testing.F) {
	data, err := os.ReadFile(filepath.Join(legacyFixtureDir, "convnet.params"))
	require.NoError(f, err)
	f.Add(data)
	f.Add(data[:100])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		params, err := readParamBlob(data)
		if err != nil {
			return
		}
		for _, p := range params {
			if n, err := tensorBytes(p.dtype, p.shape); err != nil || n != int64(len(p.data)) {
				t.Fatalf("param %s: %d bytes for %v %v", p.name, len(p.data), p.dtype, p.shape)
			}
		}
	})
}

// FuzzReadLegacyBlob: a library's __tvm_dev_mblob is refused or read, never a
// panic; its factory's graph is what FuzzReadGraphJSON reads.
func FuzzReadLegacyBlob(f *testing.F) {
	for _, lib := range []string{"convnet.so", "imported.so"} {
		blob := legacyBlobOf(f, lib)
		f.Add(blob)
		f.Add(blob[:len(blob)/2])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if blob, err := readLegacyBlob(bytes.NewReader(data), uint64(len(data))); err == nil && blob.factory {
			if g, err := readGraphJSON(blob.graphJSON); err == nil {
				checkGraph(t, g)
			}
		}
	})
}

func TestReadLegacyBlob(t *testing.T) {
	factory, err := readLegacyBlob(bytes.NewReader(legacyBlobOf(t, "convnet.so")), uint64(len(legacyBlobOf(t, "convnet.so"))))
	require.NoError(t, err)
	assert.True(t, factory.factory)
	assert.Equal(t, "default", factory.name)
	require.Len(t, factory.params, 4)
	imported := legacyBlobOf(t, "imported.so")
	plain, err := readLegacyBlob(bytes.NewReader(imported), uint64(len(imported)))
	require.NoError(t, err)
	assert.False(t, plain.factory, "an import tree holds no model")

	// A module of a kind dsoop does not run (CUDA code) cannot be passed over.
	var b bytes.Buffer
	for _, v := range []any{uint64(0), uint64(2), uint64(4), []byte("_lib"), uint64(4), []byte("cuda"), uint64(3), []byte("ptx")} {
		require.NoError(t, binary.Write(&b, binary.LittleEndian, v))
	}
	blob := b.Bytes()
	binary.LittleEndian.PutUint64(blob, uint64(len(blob)-8))
	_, err = readLegacyBlob(bytes.NewReader(blob), uint64(len(blob)))
	require.ErrorIs(t, err, ErrLegacyUnsupported)
	assert.Contains(t, err.Error(), `"cuda"`)
}

func TestParseLegacyDType(t *testing.T) {
	tests := []struct {
		in   string
		want dlpack.DataType
		ok   bool
	}{
		{"float32", dlpack.Float32, true},
		{"int8", dlpack.DataType{Code: dlpack.Int, Bits: 8, Lanes: 1}, true},
		{"uint8x4", dlpack.DataType{Code: dlpack.UInt, Bits: 8, Lanes: 4}, true},
		{"bfloat16", dlpack.DataType{Code: dlpack.Bfloat, Bits: 16, Lanes: 1}, true},
		{"bool", dlpack.DataType{Code: dlpack.UInt, Bits: 1, Lanes: 1}, true},
		{"float33", dlpack.DataType{}, false},
		{"handle", dlpack.DataType{}, false},
		{"float32x0", dlpack.DataType{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseLegacyDType(tc.in)
			if !tc.ok {
				require.ErrorIs(t, err, ErrLegacyUnsupported)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}
