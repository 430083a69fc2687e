package dsoop_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
	"github.com/tvmdsoop/tvmdsoop/internal/testenv"
)

// weightsModel is tests/modules/build_weights_model.py's model: main(x) = x @ W,
// W of rows x cols float32 constants whose bytes begin at offset in the library.
type weightsModel struct {
	library          []byte
	Offset           int
	Rows, Cols       int
	firstRowOriginal []float32
}

func buildWeightsModel(t *testing.T) *weightsModel {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, testenv.RunPython("..", "tests/modules/build_weights_model.py", dir))
	var model weightsModel
	layout, err := os.ReadFile(filepath.Join(dir, "weights.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(layout, &model))
	model.library, err = os.ReadFile(filepath.Join(dir, "weights.so"))
	require.NoError(t, err)
	model.firstRowOriginal = make([]float32, model.Cols)
	for j := range model.firstRowOriginal {
		bits := binary.LittleEndian.Uint32(model.library[model.Offset+4*j:])
		model.firstRowOriginal[j] = math.Float32frombits(bits)
	}
	return &model
}

// version writes version v of the model to path: W[0,0] = v, the rest as
// built. It returns the library's digest.
func (w *weightsModel) version(t *testing.T, path string, v int) string {
	t.Helper()
	binary.LittleEndian.PutUint32(w.library[w.Offset:], math.Float32bits(float32(v)))
	require.NoError(t, os.WriteFile(path, w.library, 0o644))
	digest := sha256.Sum256(w.library)
	return hex.EncodeToString(digest[:])
}

// footprint is the process's resident memory plus the bytes of its memfds (a
// library's memfd that is not mapped is memory too): an upper bound, since the
// mapped pages of a memfd count twice.
func footprint(t *testing.T) int64 {
	t.Helper()
	debug.FreeOSMemory()
	status, err := os.Open("/proc/self/status")
	require.NoError(t, err)
	defer status.Close()
	var rss int64
	lines := bufio.NewScanner(status)
	for lines.Scan() {
		if value, ok := strings.CutPrefix(lines.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
			require.NoError(t, err)
			rss = kb << 10
		}
	}
	require.NoError(t, lines.Err())
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	var memfds int64
	for _, fd := range fds {
		path := filepath.Join("/proc/self/fd", fd.Name())
		if target, err := os.Readlink(path); err == nil && strings.HasPrefix(target, "/memfd:") {
			if st, err := os.Stat(path); err == nil {
				memfds += st.Size()
			}
		}
	}
	return rss + memfds
}

const mib = 1 << 20

// The goal of unloading: a server that loads 40 versions of a 16 MiB model,
// one after another, each loaded, run and dropped, holds about one version's
// memory, not forty (issue 41: growth under 150 MB).
func TestFortyModelVersionsLeave(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 16 MiB model and loads 40 versions of it")
	}
	model := buildWeightsModel(t)
	require.Equal(t, 16*mib, 4*model.Rows*model.Cols, "the model's weights")
	require.NoError(t, dsoop.Init())
	dir := t.TempDir()
	x := make([]float32, model.Rows)
	x[0] = 1 // x @ W is W's row 0
	out := func(f *dsoop.VMFunc) []float32 {
		outputs, err := f.Call(mustTensor(t, x, 1, int64(model.Rows)))
		require.NoError(t, err)
		defer outputs.Close()
		return append([]float32(nil), floats(t, outputs.Tensors[0])...)
	}

	before := footprint(t)
	var peak int64
	const versions = 40
	for v := 1; v <= versions; v++ {
		path := filepath.Join(dir, fmt.Sprintf("model_v%d.so", v))
		m, err := dsoop.OpenPinned(path, model.version(t, path, v))
		require.NoError(t, err)
		f, err := m.VMFunc("main", cpu)
		require.NoError(t, err)
		row := out(f)
		require.Equal(t, float32(v), row[0], "version %d runs its own weights", v)
		require.Equal(t, model.firstRowOriginal[1:], row[1:])
		peak = max(peak, footprint(t))
		require.NoError(t, f.Close())
		require.NoError(t, m.Close())
		require.NoError(t, os.Remove(path))
	}
	after := footprint(t)
	runtime.KeepAlive(model.library) // in before, as in after
	assert.Empty(t, testenv.Memfds(t, "tvmdsoop:model_v"), "every version's memfd closed")
	t.Logf("%d versions of a 16 MiB model: footprint %.1f MiB before, %.1f MiB at the peak (one version loaded), "+
		"%.1f MiB after: growth %.1f MiB", versions, float64(before)/mib, float64(peak)/mib, float64(after)/mib,
		float64(after-before)/mib)
	assert.Less(t, after-before, int64(150*1000*1000), "growth of RSS plus memfds")
}
