package auto

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrNoPython is a compile with no Python to run it: the program loaded the op
// library with TVMDSOOP_AUTO=1 but named no TVMDSOOP_AUTO_PYTHON.
var ErrNoPython = errors.New("tf_op.auto has no Python to compile clusters with: call tf_op.auto.enable() " +
	"from Python, or set " + PythonEnv + " to a Python with tensorflow, apache-tvm and tvmdsoop")

// Input is one input of a cluster: its TF dtype (the DataType enum's value) and shape.
type Input struct {
	DType int     `json:"dtype"`
	Shape []int64 `json:"shape"`
}

// Compiled is a cluster's library for one input shape.
type Compiled struct {
	Library string `json:"library"`
	SHA256  string `json:"sha256"`
	// FLOPs are the compiled part's convolutions' and matmuls'.
	FLOPs int64 `json:"flops"`
}

// The worker's answer among what it prints: the library, or why there is none.
const (
	resultPrefix = "tvmdsoop-cluster: "
	errorPrefix  = "tvmdsoop-cluster-error: "
)

// stderrTailLines is how much of a failed worker's output an error keeps.
const stderrTailLines = 20

// Compile has the Python of o compile cluster's function (a serialized
// FunctionDefLibrary: its function first, then those it calls) for these inputs, or find it in the compile cache, and returns
// the library. The compile worker (worker.go) is kept for the next compiles,
// and killed past o's timeout.
func Compile(cluster string, function []byte, inputs []Input, o Options) (Compiled, error) {
	python := o.Python
	if python == "" {
		python = os.Getenv(PythonEnv)
	}
	if python == "" {
		return Compiled{}, ErrNoPython
	}
	dir, err := os.MkdirTemp("", "tvmdsoop-cluster-")
	if err != nil {
		return Compiled{}, err
	}
	defer os.RemoveAll(dir)
	functionPath := filepath.Join(dir, "function.pb")
	if err := os.WriteFile(functionPath, function, 0o600); err != nil {
		return Compiled{}, err
	}
	request, err := json.Marshal(map[string]any{"name": cluster, "function": functionPath, "inputs": inputs,
		"cache_dir": o.CacheDir, "target": o.Target})
	if err != nil {
		return Compiled{}, err
	}
	line, err := askWorker(python, request, o.compileTimeout())
	if errors.Is(err, errTimeout) {
		return Compiled{}, fmt.Errorf("the compile took longer than %gs (compile_timeout_s)", o.CompileTimeoutSeconds)
	}
	if err != nil {
		return Compiled{}, err
	}
	result, failure, found := parseAnswer(line)
	switch {
	case failure != "":
		return Compiled{}, errors.New(failure)
	case !found:
		return Compiled{}, fmt.Errorf("%s -m tf_op.compiler.cluster answered what is not a library: %q", python, line)
	}
	return result, nil
}

// workerEnv is this process's environment without the pass turned on: the
// worker loads the op library too, and must not cluster its own graphs.
func workerEnv(env []string) []string {
	kept := make([]string, 0, len(env))
	for _, kv := range env {
		if !strings.HasPrefix(kv, EnableEnv+"=") {
			kept = append(kept, kv)
		}
	}
	return kept
}

// parseAnswer reads one answer line of the worker (worker.go forwards those
// that start with resultPrefix or errorPrefix): the library, or the failure
// it reports.
func parseAnswer(line string) (c Compiled, failure string, found bool) {
	if text, ok := strings.CutPrefix(line, errorPrefix); ok {
		if err := json.Unmarshal([]byte(text), &failure); err != nil || failure == "" {
			failure = text
		}
		return Compiled{}, failure, true
	}
	text, ok := strings.CutPrefix(line, resultPrefix)
	if !ok || json.Unmarshal([]byte(text), &c) != nil || c.Library == "" || c.SHA256 == "" {
		return Compiled{}, "", false
	}
	return c, "", true
}

func tail(output string) string {
	lines := strings.Split(strings.TrimSpace(output), "\n")
	if len(lines) > stderrTailLines {
		lines = lines[len(lines)-stderrTailLines:]
	}
	return strings.Join(lines, "\n")
}
