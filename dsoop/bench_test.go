package dsoop_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dsoop/internal/directcall"
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
