// Package testenv is what the Go tests share: the project's Python, which builds
// the TVM test modules (TVM's compiler is Python), and the statistics of the
// interleaved benchmarks.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
)

// Python is the interpreter that builds test modules: $TVMDSOOP_PYTHON, else the
// repository's .venv (which `make test` sets up).
func Python(repoRoot string) string {
	if python := os.Getenv("TVMDSOOP_PYTHON"); python != "" {
		return python
	}
	return filepath.Join(repoRoot, ".venv", "bin", "python")
}

// RunPython runs a script of the repository with arguments, its output going to
// stderr; the error says to run `make test` when the environment is missing.
func RunPython(repoRoot, script string, args ...string) error {
	python := Python(repoRoot)
	cmd := exec.Command(python, append([]string{filepath.Join(repoRoot, script)}, args...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s %v failed (run `make test`, which sets up the .venv): %w", python, script, args, err)
	}
	return nil
}

// Median is the middle value of values (the upper one of an even count).
func Median(values []float64) float64 { return Quantile(values, 0.5) }

// Quantile is the value of values at fraction q (0 to 1) of their sorted order,
// the nearest rank: Quantile(v, 0.25) and Quantile(v, 0.75) are the quartiles.
func Quantile(values []float64, q float64) float64 {
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	return sorted[int(q*float64(len(sorted)-1)+0.5)]
}
