package dsoop_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dsoop/internal/directcall"

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
