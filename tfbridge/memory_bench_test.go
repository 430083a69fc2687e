package tfbridge_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// rssSamples is how many times BenchmarkRSS reads the RSS along the runs of a
// session, after a tenth as many runs of warm-up.
const rssSamples = 10

// BenchmarkRSS reports how the resident memory grows per Session.Run, the
// least-squares slope over 100k runs of a TVMDSOOp add-one on 1024 float32
// against AddV2, and with BenchModelsEnv over 20k runs of the CNN compiled by
// TVM (batch 1).
// Before each reading a GC runs, so tensors Go no longer holds are freed. For
// the model it also reports the RSS the model takes (library, VM, first
// instance; TVM's runtime is loaded already) and each further VM instance of
// its pool, made by concurrent calls.
func BenchmarkRSS(b *testing.B) {
	addOne := mustFunc(b, "add_one")
	input, err := tf.NewTensor(make([]float32, 1024))
	require.NoError(b, err)
	oneOp := func(apply func(s *op.Scope, x tf.Output) tf.Output) request {
		s := op.NewScope()
		x := op.Placeholder(s, tf.Float, op.PlaceholderShape(tf.MakeShape(1024)))
		y := apply(s, x)
		return sessionRequest(newSession(b, s), x, input, y)()
	}
	b.ReportMetric(rssSlope(b, oneOp(func(s *op.Scope, x tf.Output) tf.Output { return addOne.Call(s, x)[0] }),
		100_000), "rss_slope_bytes_per_call")
	b.ReportMetric(rssSlope(b, oneOp(func(s *op.Scope, x tf.Output) tf.Output {
		return op.AddV2(s, x, op.Const(s.SubScope("one"), float32(1)))
	}), 100_000), "rss_slope_tf_add_bytes_per_call")

	dir := os.Getenv(BenchModelsEnv)
	if dir == "" {
		return
	}
	// A copy: a library loads once per process per path, and BenchmarkServed's
	// copy may be loaded already, with instances in its pool.
	lib := filepath.Join(b.TempDir(), "cnn_b1.so")
	bytes, err := os.ReadFile(filepath.Join(dir, "cnn_b1.so"))
	require.NoError(b, err)
	require.NoError(b, os.WriteFile(lib, bytes, 0o600))
	image, err := dlpack.FromSlice(make([]float32, 16*16*3), 1, 16, 16, 3)
	require.NoError(b, err)
	before := rss(b)
	module, err := dsoop.Open(lib)
	require.NoError(b, err)
	defer module.Close()
	main, err := module.VMFunc("main", dlpack.Device{Type: dlpack.CPU})
	require.NoError(b, err)
	defer main.Close()
	call := func() request {
		return func() error {
			out, err := main.Call(image)
			if err == nil {
				err = out.Close()
			}
			return err
		}
	}
	require.NoError(b, call()())
	loaded := rss(b)
	serve(b, call, 8, servedFor) // more VM instances, up to TVMDSOOP_VM_INSTANCES
	if instances := main.Instances(); instances > 1 {
		b.ReportMetric(float64(rss(b)-loaded)/float64(instances-1)/1024, "vm_instance_rss_kib")
	}
	b.ReportMetric(float64(main.Instances()), "vm_instances")
	b.ReportMetric(float64(loaded-before)/(1<<20), "model_rss_mib")
	b.ReportMetric(rssSlope(b, workloadSession(b, dir), 20_000), "model_rss_slope_bytes_per_call")
}

// workloadSession is one run of the TVM-compiled CNN (batch 1) in a session.
func workloadSession(b *testing.B, dir string) request {
	return modelWorkload(b, dir, 1).session()
}

// rssSlope runs r calls times after a tenth as many of warm-up and gives the
// least-squares slope of the RSS over the runs, in bytes per run.
func rssSlope(b *testing.B, r request, calls int) float64 {
	step := calls / rssSamples
	var xs, ys []float64
	for i := -calls / 10; i <= calls; i++ {
		if i >= 0 && i%step == 0 {
			xs, ys = append(xs, float64(i)), append(ys, float64(rss(b)))
		}
		if i < calls {
			require.NoError(b, r())
		}
	}
	var mx, my float64
	for i := range xs {
		mx, my = mx+xs[i]/float64(len(xs)), my+ys[i]/float64(len(ys))
	}
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	return sxy / sxx
}

// rss is the process's resident memory in bytes after a GC (and the finalisers
// it queued, which free TF tensors, given a moment to run).
func rss(b *testing.B) int64 {
	runtime.GC()
	runtime.Gosched()
	runtime.GC()
	statm, err := os.ReadFile("/proc/self/statm")
	require.NoError(b, err)
	fields := strings.Fields(string(statm))
	pages, err := strconv.ParseInt(fields[1], 10, 64)
	require.NoError(b, err)
	return pages * int64(os.Getpagesize())
}
