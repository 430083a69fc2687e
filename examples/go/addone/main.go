// Command addone calls a TVM-compiled add_one on a Go []float32 through dsoop.
//
//	TVMDSOOP_LIBRARY_PATH=.../tvm_ffi/lib:.../tvm/lib go run ./examples/go/addone add_one.so
//
// It builds with plain `go build`: dsoop needs no cgo flags, only, at run time,
// the folders of libtvm_ffi.so (apache-tvm-ffi) and libtvm_runtime.so
// (apache-tvm) in TVMDSOOP_LIBRARY_PATH (docs/go.md). Build add_one.so with
// `python examples/build_add_one.py add_one.so`; `make go-examples` does both.
package main

import (
	"fmt"
	"log"
	"os"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: addone LIBRARY.so")
	}
	module, err := dsoop.Open(os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	defer module.Close()
	addOne, err := module.Func("add_one")
	if err != nil {
		log.Fatal(err)
	}
	defer addOne.Close()

	in := []float32{1, 2, 3, 4}
	out := make([]float32, len(in))
	x, err := dlpack.FromSlice(in)
	if err != nil {
		log.Fatal(err)
	}
	y, err := dlpack.FromSlice(out)
	if err != nil {
		log.Fatal(err)
	}
	// TVM writes into out directly: no copy on the way in or out.
	if err := addOne.Call(x, y); err != nil {
		log.Fatal(err)
	}
	fmt.Println("input: ", in)
	fmt.Println("output:", out)
}
