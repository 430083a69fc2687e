// Command cudaload checks, on a GPU machine, that dsoop opens TVM's CUDA runtime
// for a library holding CUDA code: it opens a tvm.compile'd CUDA library (from
// tests/gpu/tvm_add_one.py export-library) the way the op does, with the
// libraries of TVM_LIBRARY_PATH.
//
//	TVM_LIBRARY_PATH=build/gpu:build/gpu/tvm cudaload build/gpu/tvm_add_one_lib.so
//
// That library carries CUDA source, which only TVM's Python package compiles, so
// the expected outcome is dsoop.ErrCUDASourceNotCompiled: TVM's CUDA runtime
// opened (with the driver and libcudart.so.13), registered its loader, and the
// loader reached the CUDA code. Exit status 0 then, 2 when there is no CUDA
// driver, 1 otherwise.
package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: cudaload TVM_CUDA_LIBRARY.so")
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
}
