package dsoop

import (
	"fmt"
	"sync"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

// cudaKind is the kind of the module that holds a library's CUDA code; its
// loader is registered by TVM's CUDA runtime as cudaLoaderName.
const (
	cudaKind       = "cuda"
	cudaLoaderName = "ffi.Module.load_from_bytes." + cudaKind
	// cudaSourceFormat is the format of CUDA code kept as C++ source, which
	// TVM's CUDA runtime compiles at load only through cudaCompileCallback, a
	// function of TVM's Python package.
	cudaSourceFormat    = "cuda"
	cudaCompileCallback = "tvm_callback_cuda_compile"
)

var (
	cudaOnce sync.Once
	cudaErr  error // why TVM's CUDA runtime did not load; nil once it has
)

// loadCUDARuntime opens TVM's CUDA runtime, once, when the first library holding
// CUDA code asks for it: a process that loads none never opens the CUDA
// libraries (and CPU-only machines lack the CUDA driver they link).
func loadCUDARuntime() error {
	cudaOnce.Do(func() {
		initMu.Lock()
		libs := found
		initMu.Unlock()
		cudaErr = openCUDARuntime(libs)
	})
	return cudaErr
}

func openCUDARuntime(libs libraries) error {
	if libs.cudaRuntime == "" {
		return fmt.Errorf("%s is not beside %s on %s", cudaRuntimeLibraryName, runtimeLibraryName, LibraryPathEnv)
	}
	if libs.cudart != "" {
		if err := loadExtension(libs.cudart); err != nil {
			return err
		}
	}
	return loadExtension(libs.cudaRuntime)
}

// explainLoadFailure says what stopped TVM's loader when a library holds CUDA
// code (cuda is its embedded module; none for other libraries), from what the
// library holds and which steps before the load failed, never from TVM's
// wording: TVM's CUDA runtime did not open (cudaErr), or the code is CUDA source
// and nothing in the process compiles it (exists tells the runtime's global
// functions). Other failures pass unchanged.
func explainLoadFailure(err *Error, cuda embeddedModule, cudaErr error, exists func(name string) bool) error {
	switch {
	case cuda.kind == "":
		return err
	case cudaErr != nil:
		return fmt.Errorf("%w (the library holds CUDA code, and %w: %v)", err, ErrCUDARuntimeNotLoaded, cudaErr)
	case cuda.format == cudaSourceFormat && !exists(cudaCompileCallback):
		return fmt.Errorf("%w (%w: compile it with TVM where a CUDA driver is, see docs/gpu.md)", err, ErrCUDASourceNotCompiled)
	default:
		return err
	}
}

// checkModelDevice refuses a model compiled for CUDA on the CPU (a CUDA target's
// library under a TF kernel placed on the CPU).
func checkModelDevice(s *sealedLibrary, device dlpack.Device) error {
	if _, cuda := s.embeds(cudaKind); cuda && device.Type == dlpack.CPU {
		return ErrCUDAModelOnCPU
	}
	return nil
}
