package dsoop_test

import (
	"encoding/binary"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// corruptibleModel is a test model, the function to call and inputs it takes.
type corruptibleModel struct {
	lib, function string
	inputs        func(t testing.TB) []*dlpack.Tensor
}

var corruptibleModels = []corruptibleModel{
	{"mlp.so", "forward", func(t testing.TB) []*dlpack.Tensor {
		p := mlpParams()
		return []*dlpack.Tensor{mustTensor(t, make([]float32, 2*16), 2, 16), mustTensor(t, p[0], 32, 16),
			mustTensor(t, p[1], 32), mustTensor(t, p[2], 8, 32), mustTensor(t, p[3], 8)}
	}},
	{"two_outputs.so", "main", func(t testing.TB) []*dlpack.Tensor {
		return []*dlpack.Tensor{mustTensor(t, make([]float32, 8), 2, 4)}
	}},
}

// executableBytes finds a model library's serialized Relax VM executable: the
// bytes of a str (a u64 length, then the bytes) that begin with its magic.
func executableBytes(t testing.TB, lib []byte) (start, size int) {
	t.Helper()
	for _, magic := range []uint64{0xD225DE2F4214151E, 0xD225DE2F4214151D} {
		for at := 8; at+8 <= len(lib); at++ {
			if binary.LittleEndian.Uint64(lib[at:]) != magic {
				continue
			}
			if n := binary.LittleEndian.Uint64(lib[at-8:]); n <= uint64(len(lib)-at) {
				return at, int(n)
			}
		}
	}
	t.Fatal("no Relax VM executable in the library")
	return 0, 0
}

// runCorrupted loads a corrupted copy with its own digest pinned, so that no
// probe process stands between it and TVM's loader, and calls it: what it says
// ("refused", "failed", "ran"). A crash ends the test binary.
func runCorrupted(t testing.TB, model corruptibleModel, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), model.lib)
	require.NoError(t, os.WriteFile(path, data, 0o644))
	digest, err := dsoop.FileSHA256(path)
	require.NoError(t, err)
	m, err := dsoop.OpenPinned(path, digest)
	if err != nil {
		return "refused"
	}
	defer m.Close()
	f, err := m.VMFunc(model.function, cpu)
	if err != nil {
		return "failed"
	}
	defer f.Close()
	out, err := f.Call(model.inputs(t)...)
	if err != nil {
		return "failed"
	}
	out.Close()
	return "ran"
}

// TestCorruptedModelsNeverCrash loads and runs 30 copies of each model with 4
// random bytes changed in its Relax VM executable. Before the executable was
// verified (readVMExecutable), about 1 in 5 crashed the process: in TVM's
// reader ("Cannot find type info", SIGSEGV) or in its interpreter at the call.
func TestCorruptedModelsNeverCrash(t *testing.T) {
	for _, model := range corruptibleModels {
		t.Run(model.lib, func(t *testing.T) {
			original, err := os.ReadFile(filepath.Join(modelsDir, model.lib))
			require.NoError(t, err)
			start, size := executableBytes(t, original)
			rng := rand.New(rand.NewPCG(3, 4))
			outcomes := map[string]int{}
			for i := 0; i < 30; i++ {
				data := append([]byte(nil), original...)
				for b := 0; b < 4; b++ {
					data[start+rng.IntN(size)] = byte(rng.IntN(256))
				}
				outcomes[runCorrupted(t, model, data)]++
			}
			t.Logf("%s, 30 corrupted copies: %v", model.lib, outcomes)
			assert.Positive(t, outcomes["refused"], "the verifier refused none")
		})
	}
}

// FuzzCorruptedModelRuns changes 4 bytes of a model's executable (at offsets
// the fuzzer picks), loads the copy and runs it: whatever the verifier lets
// through must run, fail, or give wrong results, never crash. make fuzz runs it.
func FuzzCorruptedModelRuns(f *testing.F) {
	f.Add(uint8(0), uint32(40), uint32(41), uint32(300), uint32(301), uint32(0xffffffff))
	f.Add(uint8(1), uint32(100), uint32(500), uint32(900), uint32(1200), uint32(0x01020304))
	f.Fuzz(func(t *testing.T, which uint8, a, b, c, d, with uint32) {
		model := corruptibleModels[int(which)%len(corruptibleModels)]
		original, err := os.ReadFile(filepath.Join(modelsDir, model.lib))
		require.NoError(t, err)
		start, size := executableBytes(t, original)
		for i, at := range []uint32{a, b, c, d} {
			original[start+int(at)%size] = byte(with >> (8 * i))
		}
		runCorrupted(t, model, original)
	})
}

// TestNativeModelsRunOnlyAsBuilt: a model whose Relax functions are native code
// indexes the VM's registers and constants with numbers in its machine code, so
// its library must hold the executable it was built with, to the byte
// (tvmdsoop_library_bin_sha256, checkLibraryBinDigest). Every corrupted copy is
// refused, none runs; and TVM's own export, which records no digest, is refused
// with the reason.
func TestNativeModelsRunOnlyAsBuilt(t *testing.T) {
	native := corruptibleModel{"mlp_native.so", "forward", corruptibleModels[0].inputs}
	require.Equal(t, "ran", runCorrupted(t, native, mustRead(t, filepath.Join(modelsDir, native.lib))))

	original := mustRead(t, filepath.Join(modelsDir, native.lib))
	start, size := executableBytes(t, original)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 20; i++ {
		data := append([]byte(nil), original...)
		at := start + rng.IntN(size)
		data[at] ^= byte(1 + rng.IntN(255))
		assert.Equal(t, "refused", runCorrupted(t, native, data), "byte %d of the executable changed", at-start)
	}

	_, err := dsoop.Open(filepath.Join(modelsDir, "mlp_native_unrecorded.so"))
	require.ErrorIs(t, err, dsoop.ErrNotALibrary)
	assert.ErrorContains(t, err, "functions compiled to native code (forward)")
	assert.ErrorContains(t, err, "tvmdsoop_library_bin_sha256")
}

func mustRead(t testing.TB, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return data
}
