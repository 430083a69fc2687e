package dsoop_test

import (
	"debug/elf"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// structureRanges are the byte ranges of a library that the loader interprets
// before any code runs: the ELF header, the program headers, and the dynamic
// and relocation sections.
func structureRanges(t *testing.T, path string) [][2]int64 {
	t.Helper()
	f, err := elf.Open(path)
	require.NoError(t, err)
	defer f.Close()
	ranges := [][2]int64{{0, 64}}
	ranges = append(ranges, [2]int64{64, 64 + int64(len(f.Progs))*56})
	for _, name := range []string{".dynamic", ".rela.dyn", ".rela.plt"} {
		if s := f.Section(name); s != nil && s.Size > 0 {
			ranges = append(ranges, [2]int64{int64(s.Offset), int64(s.Offset + s.Size)})
		}
	}
	return ranges
}

// TestCorruptedLibrariesNeverCrash loads copies of a real TVM library with 8
// random bytes changed in the structures the loader reads, with no digest
// pinned: each must give a clean error or a library that computes correctly.
// Before libraries were checked and probed, about 2 in 5 such copies killed the
// process (SIGSEGV in the loader's relocation code, "Inconsistency detected by
// ld.so", SIGBUS).
func TestCorruptedLibrariesNeverCrash(t *testing.T) {
	if os.Getenv(dsoop.ProbeEnv) == "" || os.Getenv(dsoop.ProbeEnv) == "off" {
		t.Skipf("%s names no tvmdsoop-probe (make test sets it): the loader's crashes would take this process", dsoop.ProbeEnv)
	}
	original, err := os.ReadFile(testLib)
	require.NoError(t, err)
	ranges := structureRanges(t, testLib)
	rng := rand.New(rand.NewPCG(1, 2))
	outcomes := map[string]int{}
	for i := 0; i < 60; i++ {
		data := append([]byte(nil), original...)
		for b := 0; b < 8; b++ {
			r := ranges[rng.IntN(len(ranges))]
			data[r[0]+rng.Int64N(r[1]-r[0])] = byte(rng.IntN(256))
		}
		path := filepath.Join(t.TempDir(), fmt.Sprintf("corrupt%d.so", i))
		require.NoError(t, os.WriteFile(path, data, 0o644))
		m, err := dsoop.Open(path)
		if err != nil {
			outcomes["refused"]++
			continue
		}
		f, err := m.Func("add_one")
		if err != nil {
			outcomes["no add_one"]++
			m.Close()
			continue
		}
		out := make([]float32, 2)
		if err := f.Call(mustTensor(t, []float32{1, 2}), mustTensor(t, out)); err != nil {
			outcomes["call failed"]++
		} else {
			assert.Equal(t, []float32{2, 3}, out, "copy %d loaded and computed wrongly", i)
			outcomes["computed"]++
		}
		f.Close()
		m.Close()
	}
	t.Logf("60 corrupted copies: %v", outcomes)
}

// TestTruncatedLibrariesNeverCrash loads copies of a real TVM library cut short
// (a file copied while it was being written, a full disk): a clean error each.
// Truncated to 4 KiB the loader used to die of SIGBUS inside dlopen.
func TestTruncatedLibrariesNeverCrash(t *testing.T) {
	original, err := os.ReadFile(testLib)
	require.NoError(t, err)
	for _, size := range []int{0, 16, 64, 4096, len(original) / 2, len(original) * 9 / 10, len(original) - 1} {
		t.Run(fmt.Sprint(size, " bytes"), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cut.so")
			require.NoError(t, os.WriteFile(path, original[:size], 0o644))
			if m, err := dsoop.Open(path); err == nil {
				// Cut where nothing the loader maps lives: it must then work.
				m.Close()
				_, f := openAddOne(t, path)
				addOneWorks(t, f)
			}
		})
	}
}
