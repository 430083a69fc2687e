package tfbridge_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	corepb "github.com/wamuir/graft/tensorflow/core/protobuf/for_core_protos_go_proto"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tvmdsoop/tvmdsoop/internal/testenv"
	"github.com/tvmdsoop/tvmdsoop/tfbridge"
)

// chainLength is how many ops each benchmark graph applies in sequence, as in
// make bench's Python overhead comparison.
const chainLength = 50

// chainSession builds y = f(f(...f(x))) with chainLength ops made by apply, in
// a session with the serialized tensorflow.ConfigProto config (nil: TF's defaults).
func chainSession(b *testing.B, apply func(s *op.Scope, x tf.Output) tf.Output, config []byte) (*tf.Session, tf.Output, tf.Output) {
	b.Helper()
	s := op.NewScope()
	x := op.Placeholder(s, tf.Float, op.PlaceholderShape(tf.MakeShape(1)))
	y := x
	for range chainLength {
		y = apply(s, y)
	}
	return sessionOn(b, finalized(b, s), config), x, y
}

// noFolding is a serialized tensorflow.ConfigProto that turns Grappler's
// constant folding and arithmetic optimisation off: with them, TF folds a chain
// of AddV2s with constants into one AddV2, which it cannot do for a custom op,
// and the chains would no longer compare ops.
func noFolding(tb testing.TB) []byte {
	off := corepb.RewriterConfig_OFF
	return marshalConfig(tb, &corepb.ConfigProto{GraphOptions: &corepb.GraphOptions{
		RewriteOptions: &corepb.RewriterConfig{ConstantFolding: off, ArithmeticOptimization: off}}})
}

// BenchmarkSessionChain times Go TF sessions running chainLength TVMDSOOp
// add-ones and chainLength tf.add's, interleaved in rounds in rotating order,
// and reports the median per-round ratio (tvmdsoop/tf_add) and each run's time.
// Like with like: Grappler's folding is off (noFolding), and AddV2 writes over
// its input when nothing else uses it, so the ratio's TVMDSOOp does too
// (WithInplace). Timed beside them: a TVMDSOOp that allocates every output, and
// the tf.add chain with TF's defaults (folded into one AddV2).
func BenchmarkSessionChain(b *testing.B) {
	addOne := func(opts ...tfbridge.Option) func(s *op.Scope, x tf.Output) tf.Output {
		f := mustFunc(b, "add_one", opts...)
		return func(s *op.Scope, x tf.Output) tf.Output { return f.Call(s, x)[0] }
	}
	tfAdd := func(s *op.Scope, x tf.Output) tf.Output {
		s = s.SubScope("add")
		return op.AddV2(s, x, op.Const(s.SubScope("one"), []float32{1}))
	}
	unfolded := noFolding(b)
	contenders := []struct {
		name   string
		apply  func(s *op.Scope, x tf.Output) tf.Output
		config []byte
	}{
		{"tvmdsoop", addOne(tfbridge.WithInplace(map[int]int{0: 0})), unfolded},
		{"tf_add", tfAdd, unfolded},
		{"tvmdsoop_allocating", addOne(), unfolded},
		{"tf_add_grappler_default", tfAdd, nil},
	}
	input, err := tf.NewTensor([]float32{0})
	require.NoError(b, err)
	const perRound = 50
	runs := make([]func(n int) time.Duration, len(contenders))
	for c, contender := range contenders {
		session, x, y := chainSession(b, contender.apply, contender.config)
		runs[c] = func(n int) time.Duration {
			start := time.Now()
			for range n {
				out, err := session.Run(map[tf.Output]*tf.Tensor{x: input}, []tf.Output{y}, nil)
				if err != nil {
					b.Fatal(err)
				}
				if got := out[0].Value().([]float32)[0]; got != chainLength {
					b.Fatalf("%s chain gave %v, want %v", contender.name, got, chainLength)
				}
			}
			return time.Since(start)
		}
		runs[c](20) // warm up: kernels constructed, libraries loaded
	}
	var ratios []float64
	times := make([][]float64, len(contenders))
	for round := 0; round < max(b.N, 7); round++ {
		took := make([]time.Duration, len(contenders))
		for i := range contenders {
			c := (round + i) % len(contenders)
			took[c] = runs[c](perRound)
			times[c] = append(times[c], float64(took[c].Microseconds())/perRound)
		}
		ratios = append(ratios, float64(took[0])/float64(took[1]))
	}
	b.ReportMetric(testenv.Median(ratios), "ratio")
	for c, contender := range contenders {
		b.ReportMetric(testenv.Median(times[c]), contender.name+"-us/run")
	}
}
