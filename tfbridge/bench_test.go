package tfbridge_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tvmdsoop/tvmdsoop/internal/testenv"
)

// chainLength is how many ops each benchmark graph applies in sequence, as in
// make bench's Python overhead comparison.
const chainLength = 50

// chainSession builds y = f(f(...f(x))) with chainLength ops made by apply.
func chainSession(b *testing.B, apply func(s *op.Scope, x tf.Output) tf.Output) (*tf.Session, tf.Output, tf.Output) {
	b.Helper()
	s := op.NewScope()
	x := op.Placeholder(s, tf.Float, op.PlaceholderShape(tf.MakeShape(1)))
	y := x
	for range chainLength {
		y = apply(s, y)
	}
	return newSession(b, s), x, y
}

// BenchmarkSessionChain times a Go TF session running chainLength TVMDSOOp
// add-ones against one running chainLength tf.add's, interleaved in rounds, and
// reports the median per-round ratio (tvmdsoop/tf_add) and each run's time.
func BenchmarkSessionChain(b *testing.B) {
	addOne := mustFunc(b, "add_one")
	tvm, tvmX, tvmY := chainSession(b, func(s *op.Scope, x tf.Output) tf.Output { return addOne.Call(s, x)[0] })
	add, addX, addY := chainSession(b, func(s *op.Scope, x tf.Output) tf.Output {
		s = s.SubScope("add")
		return op.AddV2(s, x, op.Const(s.SubScope("one"), []float32{1}))
	})
	input, err := tf.NewTensor([]float32{0})
	require.NoError(b, err)
	runs := func(session *tf.Session, x, y tf.Output, n int) time.Duration {
		start := time.Now()
		for range n {
			out, err := session.Run(map[tf.Output]*tf.Tensor{x: input}, []tf.Output{y}, nil)
			if err != nil {
				b.Fatal(err)
			}
			if got := out[0].Value().([]float32)[0]; got != chainLength {
				b.Fatalf("chain gave %v, want %v", got, chainLength)
			}
		}
		return time.Since(start)
	}
	runs(tvm, tvmX, tvmY, 20) // warm up: kernels constructed, libraries loaded
	runs(add, addX, addY, 20)
	const perRound = 50
	var ratios, tvmTimes, addTimes []float64
	for round := 0; round < max(b.N, 7); round++ {
		var tvmTime, addTime time.Duration
		if round%2 == 0 {
			tvmTime, addTime = runs(tvm, tvmX, tvmY, perRound), runs(add, addX, addY, perRound)
		} else {
			addTime, tvmTime = runs(add, addX, addY, perRound), runs(tvm, tvmX, tvmY, perRound)
		}
		ratios = append(ratios, float64(tvmTime)/float64(addTime))
		tvmTimes = append(tvmTimes, float64(tvmTime.Microseconds())/perRound)
		addTimes = append(addTimes, float64(addTime.Microseconds())/perRound)
	}
	b.ReportMetric(testenv.Median(ratios), "ratio")
	b.ReportMetric(testenv.Median(tvmTimes), "tvmdsoop-us/run")
	b.ReportMetric(testenv.Median(addTimes), "tf_add-us/run")
}
