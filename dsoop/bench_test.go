package dsoop_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
	"github.com/tvmdsoop/tvmdsoop/dsoop/internal/directcall"
	"github.com/tvmdsoop/tvmdsoop/dsoop/internal/plaindlopen"

	"github.com/tvmdsoop/tvmdsoop/internal/testenv"
)

// BenchmarkCall measures one Func.Call of add_one from Go; BenchmarkDirectC the
// same call from a C loop. Their difference is the Go binding's per-call cost.
func BenchmarkCall(b *testing.B) {
	for _, n := range []int{1, 1024, 1 << 20} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			f := openFuncB(b, "add_one")
			x, y := make([]float32, n), make([]float32, n)
			xt, yt := mustTensor(b, x), mustTensor(b, y)
			b.SetBytes(int64(8 * n))
			for b.Loop() {
				if err := f.Call(xt, yt); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDirectC(b *testing.B) {
	for _, n := range []int64{1, 1024, 1 << 20} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			f := openFuncB(b, "add_one")
			b.SetBytes(8 * n)
			b.ResetTimer()
			require.NoError(b, directcall.Loop(f, n, int64(b.N)))
		})
	}
}

func TestDirectCallBaselineWorks(t *testing.T) {
	require.NoError(t, directcall.Loop(openFunc(t, "add_one"), 16, 3))
}

// BenchmarkCallOverhead times Func.Call from Go against the same call from a C
// loop, interleaved in rounds on a 1-element add-one, and reports each one's
// median time per call and their median per-round difference: the Go binding's
// cost per call.
func BenchmarkCallOverhead(b *testing.B) {
	f := openFuncB(b, "add_one")
	x, y := mustTensor(b, []float32{1}), mustTensor(b, make([]float32, 1))
	const perRound = 20000
	goCalls := func() time.Duration {
		start := time.Now()
		for range perRound {
			if err := f.Call(x, y); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	cCalls := func() time.Duration {
		start := time.Now()
		require.NoError(b, directcall.Loop(f, 1, perRound))
		return time.Since(start)
	}
	goCalls()
	cCalls()
	var goNs, cNs, diffNs []float64
	for round := 0; round < max(b.N, 7); round++ {
		var g, c time.Duration
		if round%2 == 0 {
			g, c = goCalls(), cCalls()
		} else {
			c, g = cCalls(), goCalls()
		}
		goNs = append(goNs, float64(g.Nanoseconds())/perRound)
		cNs = append(cNs, float64(c.Nanoseconds())/perRound)
		diffNs = append(diffNs, float64((g-c).Nanoseconds())/perRound)
	}
	b.ReportMetric(testenv.Median(goNs), "go-ns/call")
	b.ReportMetric(testenv.Median(cNs), "c-ns/call")
	b.ReportMetric(testenv.Median(diffNs), "overhead-ns/call")
}

// blobLibrary builds a TVM-FFI library of about size bytes: a constant array in
// a loaded segment (as a model's weights embedded by export_library are), and
// blob_size, which returns the array's size.
func blobLibrary(tb testing.TB, size int64) string {
	tb.Helper()
	return ccLibrary(tb, fmt.Sprintf(`#include <tvm/ffi/c_api.h>
// Zero but its first byte: the compiler writes it out in full without a
// gigabyte of source.
__attribute__((used)) static const unsigned char blob[%d] = {1};
TVM_FFI_DLL_EXPORT int __tvm_ffi_blob_size(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* result) {
  result->type_index = kTVMFFIInt;
  result->zero_padding = 0;
  result->v_int64 = (int64_t)sizeof(blob);
  return 0;
}
`, size))
}

func TestBlobLibraryLoads(t *testing.T) {
	lib := blobLibrary(t, 4096)
	got, err := openFuncIn(t, lib, "blob_size").CallValue()
	require.NoError(t, err)
	assert.Equal(t, int64(4096), got)
}

// BenchmarkOpen measures loading a library afresh (each Open follows the Close
// of the last Module on the path, so nothing is shared): with a pinned digest
// (read once, SHA-256, ELF checks, sealed copy, TVM's loader), without one
// (the same, and first the load in tvmdsoop-probe), and a plain dlopen of the
// file for comparison. The file is in the page cache throughout.
//
//	. build/env.sh && go test -run '^$' -bench BenchmarkOpen -benchtime 10x ./dsoop
func BenchmarkOpen(b *testing.B) {
	if probe := os.Getenv(dsoop.ProbeEnv); probe == "" || probe == "off" {
		b.Skip(dsoop.ProbeEnv + " does not name tvmdsoop-probe (. build/env.sh sets it)")
	}
	for _, size := range []struct {
		name  string
		bytes int64
	}{{"1MiB", 1 << 20}, {"64MiB", 64 << 20}, {"256MiB", 256 << 20}} {
		lib := blobLibrary(b, size.bytes)
		digest, err := dsoop.FileSHA256(lib)
		require.NoError(b, err)
		st, err := os.Stat(lib)
		require.NoError(b, err)
		open := func(b *testing.B, sha256 string) {
			b.SetBytes(st.Size())
			for b.Loop() {
				m, err := dsoop.OpenPinned(lib, sha256)
				if err != nil {
					b.Fatal(err)
				}
				m.Close()
			}
		}
		b.Run(size.name+"/pinned", func(b *testing.B) { open(b, digest) })
		b.Run(size.name+"/probe", func(b *testing.B) { open(b, "") })
		b.Run(size.name+"/dlopen", func(b *testing.B) {
			for b.Loop() {
				if err := plaindlopen.OpenClose(lib); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
