// Package auto keeps what the automatic clustering of TF graphs (tf_op.auto,
// docs/auto.md) needs of Go: its options, the report of the clusters made, and
// the compile of a cluster for one input shape, which runs in a Python process
// (tf_op.compiler.cluster) because TF's converter and TVM's compiler are Python.
//
// The graph pass and the cluster kernel are C++ (kernels/auto_pass.cc,
// kernels/cluster_kernel.cc); kernels/auto.go joins them to this package.
package auto

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// Environment variables read when the library loads.
const (
	// EnableEnv set to 1 turns the pass on for programs that only load the op
	// library (Go sessions, TF Serving, a SavedModel loaded after import tf_op).
	EnableEnv = "TVMDSOOP_AUTO"
	// PythonEnv names the Python that compiles clusters: one with tensorflow,
	// apache-tvm and tvmdsoop. tf_op.auto.enable() gives its own.
	PythonEnv = "TVMDSOOP_AUTO_PYTHON"
	// CacheDirEnv is the compile cache folder tf_op.compile uses too.
	CacheDirEnv = "TVMDSOOP_CACHE_DIR"
)

// Options are tf_op.auto.enable's, in its JSON names.
type Options struct {
	Enabled bool `json:"enabled"`
	// MinClusterSize is the fewest ops (constants and identities not counted)
	// a cluster may have.
	MinClusterSize int `json:"min_cluster_size"`
	// TimingFallback times each compiled shape against TF on its first runs
	// and keeps TF where TVM's code is slower.
	TimingFallback bool `json:"timing_fallback"`
	// Wait makes the first call of a shape wait for its compile; without it,
	// TF runs the shape until its compile ends.
	Wait bool `json:"wait"`
	// MaxShapes is how many input shapes a cluster compiles; later ones run TF.
	MaxShapes int `json:"max_shapes"`
	// CacheDir is the compile cache folder; empty: TVMDSOOP_CACHE_DIR, else
	// the user's cache folder.
	CacheDir string `json:"cache_dir"`
	// Python compiles the clusters; empty: TVMDSOOP_AUTO_PYTHON.
	Python string `json:"python"`
	// CompileTimeoutSeconds bounds one compile; past it the shape runs TF.
	CompileTimeoutSeconds float64 `json:"compile_timeout_s"`
	// Target is what the clusters are compiled for: TargetHost (also when
	// empty), or TargetPortable, the libraries tf_op.auto.convert ships.
	Target string `json:"target"`
}

// The targets a cluster compiles for (tf_op.compile's names).
const (
	// TargetHost is this machine's CPU, all its features.
	TargetHost = "native"
	// TargetPortable is x86-64 at several levels in one library, the level
	// chosen by the CPU that loads it: for libraries that travel.
	TargetPortable = "portable"
)

// DefaultOptions are the options before any enable(): on where EnableEnv is 1.
func DefaultOptions() Options {
	return Options{
		Enabled:               os.Getenv(EnableEnv) == "1",
		MinClusterSize:        2,
		TimingFallback:        true,
		Wait:                  true,
		MaxShapes:             8,
		CompileTimeoutSeconds: 600,
	}
}

// Validate refuses options the pass and the kernel cannot work with.
func (o Options) Validate() error {
	var errs []error
	if o.MinClusterSize < 1 {
		errs = append(errs, fmt.Errorf("min_cluster_size must be at least 1, got %d", o.MinClusterSize))
	}
	if o.MaxShapes < 1 {
		errs = append(errs, fmt.Errorf("max_shapes must be at least 1, got %d", o.MaxShapes))
	}
	if o.CompileTimeoutSeconds <= 0 {
		errs = append(errs, fmt.Errorf("compile_timeout_s must be positive, got %g", o.CompileTimeoutSeconds))
	}
	if o.Target != "" && o.Target != TargetHost && o.Target != TargetPortable {
		errs = append(errs, fmt.Errorf("target must be %q or %q, got %q", TargetHost, TargetPortable, o.Target))
	}
	return errors.Join(errs...)
}

func (o Options) compileTimeout() time.Duration {
	return time.Duration(o.CompileTimeoutSeconds * float64(time.Second))
}

var (
	mu      sync.Mutex
	current = DefaultOptions()
)

// Configure replaces the options. Turning the pass on (again) starts a new
// report: report() lists the clusters made since the last enable(); turning it
// off lets the compile worker go.
func Configure(o Options) error {
	if err := o.Validate(); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	if o.Enabled {
		resetReport()
	} else {
		go stopWorker() // after the compile that may be running
	}
	current = o
	return nil
}

// Current returns the options in force.
func Current() Options {
	mu.Lock()
	defer mu.Unlock()
	return current
}
