package auto

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		change  func(*Options)
		wantErr string
	}{
		{"defaults", func(*Options) {}, ""},
		{"min cluster size", func(o *Options) { o.MinClusterSize = 0 }, "min_cluster_size must be at least 1"},
		{"max shapes", func(o *Options) { o.MaxShapes = -1 }, "max_shapes must be at least 1"},
		{"timeout", func(o *Options) { o.CompileTimeoutSeconds = 0 }, "compile_timeout_s must be positive"},
		{"portable target", func(o *Options) { o.Target = TargetPortable }, ""},
		{"unknown target", func(o *Options) { o.Target = "cuda" }, `target must be "native" or "portable", got "cuda"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := DefaultOptions()
			tt.change(&o)
			err := o.Validate()
			if tt.wantErr == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.wantErr)
		})
	}
}

func TestDefaultOptionsFollowTheEnvironment(t *testing.T) {
	t.Setenv(EnableEnv, "1")
	assert.True(t, DefaultOptions().Enabled)
	t.Setenv(EnableEnv, "0")
	assert.False(t, DefaultOptions().Enabled)
}

func TestParseAnswer(t *testing.T) {
	tests := []struct {
		name        string
		output      string
		want        Compiled
		wantFailure string
		wantFound   bool
	}{
		{"library", "tvmdsoop-cluster: {\"library\": \"/c/a.so\", \"sha256\": \"ab\", \"flops\": 4096}",
			Compiled{Library: "/c/a.so", SHA256: "ab", FLOPs: 4096}, "", true},
		{"failure", "tvmdsoop-cluster-error: \"CompileError: no\"\n", Compiled{}, "CompileError: no", true},
		{"failure not JSON", "tvmdsoop-cluster-error: plain words", Compiled{}, "plain words", true},
		{"no answer", "ImportError: tf_op", Compiled{}, "", false},
		{"a library without its digest", "tvmdsoop-cluster: {\"library\": \"l\"}", Compiled{}, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, failure, found := parseAnswer(tt.output)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.wantFailure, failure)
			assert.Equal(t, tt.wantFound, found)
		})
	}
}

func TestWorkerEnvTurnsThePassOff(t *testing.T) {
	got := workerEnv([]string{"PATH=/bin", "TVMDSOOP_AUTO=1", "TVMDSOOP_AUTO_PYTHON=/py", "TVMDSOOP_AUTOX=1"})
	assert.Equal(t, []string{"PATH=/bin", "TVMDSOOP_AUTO_PYTHON=/py", "TVMDSOOP_AUTOX=1"}, got)
}

func TestCompileWithoutPython(t *testing.T) {
	t.Setenv(PythonEnv, "")
	_, err := Compile("c", nil, nil, DefaultOptions())
	assert.ErrorIs(t, err, ErrNoPython)
}

// fakePython writes a shell script that stands in for the worker's Python.
func fakePython(t *testing.T, script string) string {
	python := filepath.Join(t.TempDir(), "python")
	require.NoError(t, os.WriteFile(python, []byte("#!/bin/sh\n"+script+"\n"), 0o755))
	return python
}

// A worker answers request after request, and goes when idle for workerIdle.
func TestTheWorkerStaysForTheNextCompilesThenGoes(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log")
	python := fakePython(t, `echo start >> `+log+`
		while read -r request; do echo 'tvmdsoop-cluster: {"library": "/l.so", "sha256": "33"}'; done
		echo end >> `+log)
	saved := workerIdle
	workerIdle = 300 * time.Millisecond
	t.Cleanup(func() { workerIdle = saved })
	o := DefaultOptions()
	o.Python = python
	for i := 0; i < 3; i++ {
		got, err := Compile("cluster_0", []byte("function"), nil, o)
		require.NoError(t, err)
		assert.Equal(t, Compiled{Library: "/l.so", SHA256: "33"}, got)
	}
	started, _ := os.ReadFile(log)
	assert.Equal(t, "start\n", string(started), "one worker for the three compiles")
	assert.Eventually(t, func() bool {
		ended, _ := os.ReadFile(log)
		return string(ended) == "start\nend\n"
	}, 5*time.Second, 50*time.Millisecond, "the idle worker was let go")
}

// A worker that ended after an answer is replaced at the next compile.
func TestAWorkerThatEndedIsReplaced(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log")
	python := fakePython(t, `echo start >> `+log+`; echo 'tvmdsoop-cluster: {"library": "/m.so", "sha256": "44"}'`)
	o := DefaultOptions()
	o.Python = python
	for i := 0; i < 2; i++ {
		_, err := Compile("cluster_0", []byte("function"), nil, o)
		require.NoError(t, err)
	}
	started, _ := os.ReadFile(log)
	assert.Equal(t, "start\nstart\n", string(started))
}

// A worker that is a shell script, standing in for the Python: what Compile
// makes of its answer, its silence and its timeout.
func TestCompileRunsTheWorker(t *testing.T) {
	tests := []struct {
		name    string
		script  string
		timeout float64
		want    Compiled
		wantErr string
	}{
		{"answer", `echo noise; echo 'tvmdsoop-cluster: {"library": "/x.so", "sha256": "00"}'`, 10,
			Compiled{Library: "/x.so", SHA256: "00"}, ""},
		{"failure", `echo 'tvmdsoop-cluster-error: "ValueError: bad graph"'; exit 1`, 10, Compiled{}, "ValueError: bad graph"},
		{"crash", `echo 'Segmentation fault' >&2; exit 139`, 10, Compiled{}, "Segmentation fault"},
		{"pass left on", `[ -z "${TVMDSOOP_AUTO:-}" ] || { echo 'tvmdsoop-cluster-error: "recursion"'; exit 1; }
			echo 'tvmdsoop-cluster: {"library": "/y.so", "sha256": "11"}'`, 10, Compiled{Library: "/y.so", SHA256: "11"}, ""},
		{"timeout", `sleep 5`, 0.2, Compiled{}, "longer than 0.2s"},
		{"target", `read -r request; case "$request" in *'"target":"portable"'*) ;; *) exit 1;; esac
			echo 'tvmdsoop-cluster: {"library": "/p.so", "sha256": "22"}'`, 10, Compiled{Library: "/p.so", SHA256: "22"}, ""},
		{"an answer that is no library", `echo 'tvmdsoop-cluster: {"library": "/q.so"}'`, 10, Compiled{},
			"answered what is not a library"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(EnableEnv, "1")
			python := fakePython(t, tt.script)
			o := DefaultOptions()
			o.Python, o.CompileTimeoutSeconds, o.Target = python, tt.timeout, TargetPortable
			got, err := Compile("cluster_0", []byte("function"), []Input{{DType: 1, Shape: []int64{2, 3}}}, o)
			if tt.wantErr != "" {
				assert.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestReport(t *testing.T) {
	require.NoError(t, Configure(Options{Enabled: true, MinClusterSize: 2, MaxShapes: 8, CompileTimeoutSeconds: 1}))
	t.Cleanup(func() { require.NoError(t, Configure(DefaultOptions())) })
	ClusterMade("c0", "f", []string{"Conv2D", "Relu"}, "")
	ClusterMade("c1", "f", []string{"MatMul"}, "the cluster's results are not used")
	ShapeEvent("c0", ShapeRecord{Shape: "[1,8]", Status: "timing", CompileSeconds: 2.5, Library: "/a.so", SHA256: "aa", FLOPs: 64})
	ShapeEvent("c0", ShapeRecord{Shape: "[2,8]", Status: "tvm", CompileSeconds: 1.5, Library: "/b.so", SHA256: "bb", FLOPs: 128})
	ShapeEvent("c0", ShapeRecord{Shape: "[1,8]", Status: "tf", Reason: "slower", CompileSeconds: 2.5, Library: "/a.so", SHA256: "aa", FLOPs: 64})

	report := Report()
	require.Len(t, report, 2)
	assert.Equal(t, "tf", report[0].Status, "the shape that ran last decides")
	assert.Equal(t, "slower", report[0].Reason)
	assert.InDelta(t, 4.0, report[0].CompileSeconds, 1e-9)
	assert.Equal(t, []ShapeRecord{
		{Shape: "[1,8]", Status: "tf", Reason: "slower", CompileSeconds: 2.5, Library: "/a.so", SHA256: "aa", FLOPs: 64},
		{Shape: "[2,8]", Status: "tvm", CompileSeconds: 1.5, Library: "/b.so", SHA256: "bb", FLOPs: 128},
	}, report[0].Shapes)
	assert.Equal(t, Cluster{Name: "c1", Graph: "f", Ops: []string{"MatMul"}, Status: "tf",
		Reason: "the cluster's results are not used", Shapes: []ShapeRecord{}}, report[1])

	report[0].Ops[0] = "changed"
	assert.Equal(t, "Conv2D", Report()[0].Ops[0], "Report returns a copy")

	require.NoError(t, Configure(Options{Enabled: true, MinClusterSize: 2, MaxShapes: 8, CompileTimeoutSeconds: 1}))
	assert.Empty(t, Report(), "enable() starts a new report")
}
