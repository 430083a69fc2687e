package tfbridge_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	corepb "github.com/wamuir/graft/tensorflow/core/protobuf/for_core_protos_go_proto"
	"github.com/wamuir/graft/tensorflow/op"
	"google.golang.org/protobuf/proto"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
	"github.com/tvmdsoop/tvmdsoop/dsoop"
	"github.com/tvmdsoop/tvmdsoop/internal/testenv"
	"github.com/tvmdsoop/tvmdsoop/tfbridge"
)

// BenchModelsEnv names the folder of make bench's whole models (bench/run.py
// sets it): cnn_b1.so and cnn_b32.so, the Keras CNN compiled by TVM at batch 1
// and 32, and cnn_savedmodel, the same Keras model as a SavedModel. Without it
// the benchmarks serve the matmul only.
const BenchModelsEnv = "TVMDSOOP_BENCH_MODELS"

// servedCallers are the numbers of concurrent callers; servedFor how long each
// contender serves in each round.
var servedCallers = []int{1, 2, 8}

var modelBatches = []int{1, 32}

const servedFor = 200 * time.Millisecond

// servedRounds is the least number of rounds: with 5, medians of the matmul's
// ratio at 8 callers ranged 0.89-0.98 over runs of the same code; with 9, 0.90-0.97.
const servedRounds = 9

// request serves one request; a contender makes one per caller (its own
// output buffers, where it has any).
type request func() error

// workload is one job served three ways: a Go TF session running TVMDSOOp, the
// same TVM code called directly (dsoop), and TF's own equivalent in a session;
// and floor, a session that only passes its input through (what any Session.Run
// costs). inCaller is the TVMDSOOp session again, configured to run each Run in
// its caller's thread (inCallersThread).
type workload struct {
	name                                   string
	session, direct, tfOp, floor, inCaller func() request
}

// inCallersThread is a serialized tensorflow.ConfigProto that makes a session
// run each Run in the thread that called it (inter_op_parallelism_threads: -1)
// instead of handing the graph to TF's inter-op pool and waiting, as
// docs/go.md shows servers.
func inCallersThread(tb testing.TB) []byte {
	return marshalConfig(tb, &corepb.ConfigProto{InterOpParallelismThreads: -1})
}

// marshalConfig serializes a tensorflow.ConfigProto, as tf.SessionOptions takes it.
func marshalConfig(tb testing.TB, config *corepb.ConfigProto) []byte {
	tb.Helper()
	serialized, err := proto.Marshal(config)
	require.NoError(tb, err)
	return serialized
}

// BenchmarkServed measures requests per second of N concurrent callers (N in
// servedCallers) of each workload, the contenders interleaved in rounds (their
// order rotating), and reports per workload and N the medians (and quartiles)
// of the per-round ratios session/direct, session/TF and inCaller/direct, each
// contender's median requests/s (and the floor's), and the process's threads at
// the end.
//
//	. build/env.sh && TVMDSOOP_BENCH_MODELS=build/bench/models go test -run '^$' -bench BenchmarkServed -benchtime 5x ./tfbridge
func BenchmarkServed(b *testing.B) {
	workloads := []workload{matmulWorkload(b)}
	if dir := os.Getenv(BenchModelsEnv); dir != "" {
		for _, batch := range modelBatches {
			workloads = append(workloads, modelWorkload(b, dir, batch))
		}
	}
	for _, w := range workloads {
		for _, callers := range servedCallers {
			contenders := []func() request{w.session, w.direct, w.tfOp, w.floor, w.inCaller}
			rps := make([][]float64, len(contenders))
			var vsDirect, vsTF, inCallerVsDirect []float64
			for _, c := range contenders {
				serve(b, c, callers, servedFor/4) // warm up: kernels, VM instances, thread pools
			}
			for round := 0; round < max(b.N, servedRounds); round++ {
				got := make([]float64, len(contenders))
				for k := range contenders {
					i := (k + round) % len(contenders)
					got[i] = serve(b, contenders[i], callers, servedFor)
					rps[i] = append(rps[i], got[i])
				}
				vsDirect, vsTF = append(vsDirect, got[0]/got[1]), append(vsTF, got[0]/got[2])
				inCallerVsDirect = append(inCallerVsDirect, got[4]/got[1])
			}
			key := fmt.Sprintf("%s_n%d", w.name, callers)
			reportSpread(b, vsDirect, "served_ratio_vs_direct_"+key)
			reportSpread(b, vsTF, "served_ratio_vs_tf_"+key)
			reportSpread(b, inCallerVsDirect, "served_in_caller_ratio_vs_direct_"+key)
			for i, name := range []string{"session", "direct", "tf", "floor", "in_caller"} {
				b.ReportMetric(testenv.Median(rps[i]), fmt.Sprintf("served_%s_%s_rps", key, name))
			}
		}
	}
	tasks, err := os.ReadDir("/proc/self/task")
	require.NoError(b, err)
	b.ReportMetric(float64(len(tasks)), "served_threads")
}

// reportSpread reports the median of values as unit, and its quartiles as
// unit_q1 and unit_q3.
func reportSpread(b *testing.B, values []float64, unit string) {
	b.ReportMetric(testenv.Median(values), unit)
	b.ReportMetric(testenv.Quantile(values, 0.25), unit+"_q1")
	b.ReportMetric(testenv.Quantile(values, 0.75), unit+"_q3")
}

// serve runs callers goroutines, each serving requests back to back for d, and
// gives the requests served per second.
func serve(b *testing.B, contender func() request, callers int, d time.Duration) float64 {
	requests := make([]request, callers)
	for i := range requests {
		requests[i] = contender()
	}
	var served atomic.Int64
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for _, r := range requests {
		wg.Go(func() {
			n := int64(0)
			for ; time.Since(start) < d; n++ {
				if err := r(); err != nil {
					failed.Store(&err)
					return
				}
			}
			served.Add(n)
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	return float64(served.Load()) / elapsed.Seconds()
}

// sessionRequest runs fetch in session, feeding input to x, and releases the
// output as a server does once it has sent it: left to Go's collector, each
// output would be fresh memory (tfbridge.Release), which the direct contenders
// do not pay.
func sessionRequest(session *tf.Session, x tf.Output, input *tf.Tensor, fetch tf.Output) func() request {
	return func() request {
		return func() error {
			out, err := session.Run(map[tf.Output]*tf.Tensor{x: input}, []tf.Output{fetch}, nil)
			if err != nil {
				return err
			}
			return tfbridge.Release(out...)
		}
	}
}

// floorRequest runs a session that passes input through an Identity.
func floorRequest(b *testing.B, input *tf.Tensor) func() request {
	s := op.NewScope()
	x := op.Placeholder(s, input.DataType(), op.PlaceholderShape(tf.MakeShape(input.Shape()...)))
	y := op.Identity(s, x)
	return sessionRequest(newSession(b, s), x, input, y)
}

// newSession is a session on the graph s built, closed when tb ends.
func newSession(tb testing.TB, s *op.Scope) *tf.Session {
	tb.Helper()
	return sessionOn(tb, finalized(tb, s), nil)
}

// finalized is the graph s built.
func finalized(tb testing.TB, s *op.Scope) *tf.Graph {
	tb.Helper()
	graph, err := s.Finalize()
	require.NoError(tb, err)
	return graph
}

// sessionOn is a session on graph with the serialized tensorflow.ConfigProto
// config (nil: TF's defaults), closed when tb ends.
func sessionOn(tb testing.TB, graph *tf.Graph, config []byte) *tf.Session {
	tb.Helper()
	session, err := tf.NewSession(graph, &tf.SessionOptions{Config: config})
	require.NoError(tb, err)
	tb.Cleanup(func() { session.Close() })
	return session
}

// matmulWorkload is c = a @ b, 512x512 float32, by testLib's folder's matmul.so
// (a parallel TVM schedule) and by TF's MatMul; b is a constant of the graphs.
func matmulWorkload(b *testing.B) workload {
	const n = 512
	rng := rand.New(rand.NewPCG(1, 2))
	a, w := make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i], w[i] = rng.Float32(), rng.Float32()
	}
	rows := func(v []float32) [][]float32 {
		out := make([][]float32, n)
		for i := range out {
			out[i] = v[i*n : (i+1)*n]
		}
		return out
	}
	input, err := tf.NewTensor(rows(a))
	require.NoError(b, err)
	graph := func(product func(s *op.Scope, x, w tf.Output) tf.Output) (*tf.Graph, tf.Output, tf.Output) {
		s := op.NewScope()
		x := op.Placeholder(s, tf.Float, op.PlaceholderShape(tf.MakeShape(n, n)))
		y := product(s, x, op.Const(s.SubScope("w"), rows(w)))
		return finalized(b, s), x, y
	}
	lib := filepath.Join(filepath.Dir(testLib), "matmul.so")
	matmul := mustFuncIn(b, lib, "matmul")
	tvmGraph, tvmX, tvmY := graph(func(s *op.Scope, x, w tf.Output) tf.Output { return matmul.Call(s, x, w)[0] })
	tvm, tvmInCaller := sessionOn(b, tvmGraph, nil), sessionOn(b, tvmGraph, inCallersThread(b))
	nativeGraph, nativeX, nativeY := graph(func(s *op.Scope, x, w tf.Output) tf.Output { return op.MatMul(s, x, w) })
	native := sessionOn(b, nativeGraph, nil)
	want := run1(b, native, nativeX, input, nativeY)
	checkClose(b, run1(b, tvm, tvmX, input, tvmY), want, "matmul")
	checkClose(b, run1(b, tvmInCaller, tvmX, input, tvmY), want, "matmul in the caller's thread")

	module, err := dsoop.Open(lib)
	require.NoError(b, err)
	b.Cleanup(func() { module.Close() })
	direct, err := module.Func("matmul")
	require.NoError(b, err)
	at, err := dlpack.FromSlice(a, n, n)
	require.NoError(b, err)
	wt, err := dlpack.FromSlice(w, n, n)
	require.NoError(b, err)
	return workload{
		name:     "matmul",
		session:  sessionRequest(tvm, tvmX, input, tvmY),
		inCaller: sessionRequest(tvmInCaller, tvmX, input, tvmY),
		tfOp:     sessionRequest(native, nativeX, input, nativeY),
		floor:    floorRequest(b, input),
		direct: func() request {
			c, err := dlpack.FromSlice(make([]float32, n*n), n, n)
			require.NoError(b, err)
			return func() error { return direct.Call(at, wt, c) }
		},
	}
}

// modelWorkload is the Keras CNN at a batch: compiled by TVM (a Relax VM
// executable) in a session and called directly, against the Keras model's
// SavedModel in a session.
func modelWorkload(b *testing.B, dir string, batch int) workload {
	shape := []int64{int64(batch), 16, 16, 3}
	image := make([]float32, batch*16*16*3)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range image {
		image[i] = rng.Float32()
	}
	input, err := tf.NewTensor(image)
	require.NoError(b, err)
	require.NoError(b, input.Reshape(shape))

	lib := filepath.Join(dir, fmt.Sprintf("cnn_b%d.so", batch))
	s := op.NewScope()
	x := op.Placeholder(s, tf.Float, op.PlaceholderShape(tf.MakeShape(shape...)))
	y := mustFuncIn(b, lib, "main").Call(s, x)[0]
	tvmGraph := finalized(b, s)
	tvm, tvmInCaller := sessionOn(b, tvmGraph, nil), sessionOn(b, tvmGraph, inCallersThread(b))

	keras, err := tf.LoadSavedModel(filepath.Join(dir, "cnn_savedmodel"), []string{"serve"}, nil)
	require.NoError(b, err)
	b.Cleanup(func() { keras.Session.Close() })
	signature := keras.Signatures["serving_default"]
	kerasX := graphOutput(b, keras.Graph, signature.Inputs["image"].Name)
	kerasY := graphOutput(b, keras.Graph, signature.Outputs["output_0"].Name)
	want := run1(b, keras.Session, kerasX, input, kerasY)
	checkClose(b, run1(b, tvm, x, input, y), want, "Keras CNN")
	checkClose(b, run1(b, tvmInCaller, x, input, y), want, "Keras CNN in the caller's thread")

	module, err := dsoop.Open(lib)
	require.NoError(b, err)
	b.Cleanup(func() { module.Close() })
	main, err := module.VMFunc("main", dlpack.Device{Type: dlpack.CPU})
	require.NoError(b, err)
	b.Cleanup(func() { main.Close() })
	it, err := dlpack.FromSlice(image, shape...)
	require.NoError(b, err)
	return workload{
		name:     fmt.Sprintf("model_b%d", batch),
		session:  sessionRequest(tvm, x, input, y),
		inCaller: sessionRequest(tvmInCaller, x, input, y),
		tfOp:     sessionRequest(keras.Session, kerasX, input, kerasY),
		floor:    floorRequest(b, input),
		direct: func() request {
			return func() error {
				out, err := main.Call(it)
				if err == nil {
					err = out.Close()
				}
				return err
			}
		},
	}
}

func mustFuncIn(b *testing.B, lib, name string) *tfbridge.Func {
	b.Helper()
	m, err := tfbridge.NewModule(lib)
	require.NoError(b, err)
	f, err := m.Func(name)
	require.NoError(b, err)
	return f
}

func run1(b *testing.B, session *tf.Session, x tf.Output, input *tf.Tensor, y tf.Output) []float32 {
	out, err := session.Run(map[tf.Output]*tf.Tensor{x: input}, []tf.Output{y}, nil)
	require.NoError(b, err)
	var flat []float32
	switch v := out[0].Value().(type) {
	case [][]float32:
		for _, row := range v {
			flat = append(flat, row...)
		}
	default:
		b.Fatalf("unexpected output %T", v)
	}
	return flat
}

// checkClose stops the benchmark unless TVM's result matches TF's to float32
// rounding (relative to the largest magnitude).
func checkClose(b *testing.B, got, want []float32, what string) {
	require.Len(b, got, len(want))
	scale := 0.0
	for _, v := range want {
		scale = math.Max(scale, math.Abs(float64(v)))
	}
	for i := range want {
		require.InDelta(b, want[i], got[i], 1e-4*scale, "%s: element %d", what, i)
	}
}
