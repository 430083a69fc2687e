package dsoop

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

// TestExplainLoadFailure: why a library holding CUDA code did not load is told
// by what it holds and by what failed before the load, whatever TVM's words.
func TestExplainLoadFailure(t *testing.T) {
	tvmErr := &Error{Kind: "RuntimeError", Message: "any wording"}
	cudaRuntimeErr := errors.New("cannot open libtvm_runtime_cuda.so: libcuda.so.1")
	none := func(string) bool { return false }
	compiler := func(name string) bool { return name == cudaCompileCallback }
	tests := []struct {
		name     string
		cuda     embeddedModule
		cudaErr  error
		exists   func(string) bool
		want     error // besides tvmErr
		contains string
	}{
		{"no CUDA code", embeddedModule{}, nil, none, nil, ""},
		{"the CUDA runtime did not open", embeddedModule{kind: cudaKind, format: "fatbin"}, cudaRuntimeErr, none,
			ErrCUDARuntimeNotLoaded, "the library holds CUDA code, and TVM's CUDA runtime did not load: cannot open libtvm_runtime_cuda.so: libcuda.so.1"},
		{"CUDA source, no compiler", embeddedModule{kind: cudaKind, format: cudaSourceFormat}, nil, none,
			ErrCUDASourceNotCompiled, "compile it with TVM where a CUDA driver is"},
		{"CUDA source, a compiler registered", embeddedModule{kind: cudaKind, format: cudaSourceFormat}, nil, compiler, nil, ""},
		{"compiled CUDA code", embeddedModule{kind: cudaKind, format: "fatbin"}, nil, none, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := explainLoadFailure(tvmErr, tc.cuda, tc.cudaErr, tc.exists)
			require.ErrorIs(t, err, tvmErr)
			if tc.want == nil {
				assert.Equal(t, error(tvmErr), err, "passed unchanged")
				return
			}
			assert.ErrorIs(t, err, tc.want)
			assert.Contains(t, err.Error(), tc.contains)
		})
	}
}

// TestCheckModelDevice: a model holding CUDA code runs on a CUDA device only;
// others run anywhere the caller asks.
func TestCheckModelDevice(t *testing.T) {
	cuda := &sealedLibrary{embedded: []embeddedModule{{kind: "relax.VMExecutable"}, {kind: cudaKind, format: "fatbin"}}}
	cpuOnly := &sealedLibrary{embedded: []embeddedModule{{kind: "relax.VMExecutable"}}}
	tests := []struct {
		name    string
		library *sealedLibrary
		device  dlpack.Device
		want    error
	}{
		{"CUDA model on the CPU", cuda, dlpack.Device{Type: dlpack.CPU}, ErrCUDAModelOnCPU},
		{"CUDA model on a GPU", cuda, dlpack.Device{Type: dlpack.CUDA}, nil},
		{"CPU model on the CPU", cpuOnly, dlpack.Device{Type: dlpack.CPU}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.ErrorIs(t, checkModelDevice(tc.library, tc.device), tc.want)
		})
	}
}
