// Command cudaload checks, on a GPU machine, that dsoop opens TVM's CUDA runtime
// for a library holding CUDA code: it opens a tvm.compile'd CUDA library (from
// tests/gpu/tvm_add_one.py export-library) the way the op does, with the
// libraries of TVMDSOOP_LIBRARY_PATH.
//
//	TVMDSOOP_LIBRARY_PATH=build/gpu:build/gpu/tvm cudaload build/gpu/tvm_add_one_lib.so
//
// That library carries CUDA source, which only TVM's Python package compiles, so
// the expected outcome is dsoop.ErrCUDASourceNotCompiled: TVM's CUDA runtime
// opened (with the driver and libcudart.so.13), registered its loader, and the
// loader reached the CUDA code. Exit status 0 then, 2 when there is no CUDA
// driver, 1 otherwise.
//
// With a second argument, a whole model compiled for CUDA (build_models.py's
// mlp_cuda.so, compiled GPU code), it also opens that the way the op does (a
// sealed in-memory copy of the file) and starts its VM on GPU 0, which loads
// the model's CUDA code from the copy: what the op does before a model's
// first call on a GPU.
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

func main() {
	if len(os.Args) != 2 && len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: cudaload TVM_CUDA_LIBRARY.so [MODEL_CUDA.so]")
		os.Exit(1)
	}
	_, err := dsoop.Open(os.Args[1])
	switch {
	case errors.Is(err, dsoop.ErrCUDASourceNotCompiled):
		fmt.Println("TVM's CUDA runtime opened and loaded the library's CUDA code (as source, as expected)")
	case errors.Is(err, dsoop.ErrCUDARuntimeNotLoaded) && strings.Contains(err.Error(), "libcuda.so.1"):
		fmt.Fprintln(os.Stderr, "cudaload: no CUDA driver here:", err)
		os.Exit(2)
	case err == nil:
		fmt.Fprintln(os.Stderr, "cudaload: the library loaded, but it should carry uncompiled CUDA source")
		os.Exit(1)
	default:
		fmt.Fprintln(os.Stderr, "cudaload:", err)
		os.Exit(1)
	}
	if len(os.Args) == 3 {
		startModel(os.Args[2])
	}
}

// startModel opens a model compiled for CUDA and starts its VM on GPU 0.
func startModel(path string) {
	m, err := dsoop.Open(path)
	if err != nil || !m.IsVM() {
		fmt.Fprintln(os.Stderr, "cudaload: the model did not open as a Relax VM executable:", err)
		os.Exit(1)
	}
	defer m.Close()
	forward, err := m.VMFunc("forward", dlpack.Device{Type: dlpack.CUDA, ID: 0})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cudaload: the model's VM did not start on the GPU:", err)
		os.Exit(1)
	}
	defer forward.Close()
	fmt.Printf("the model's VM started on GPU 0 from the sealed copy of %s (forward takes %d inputs)\n", path, forward.Arity())
}
