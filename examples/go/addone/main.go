// Command addone calls a TVM-compiled add_one on a Go []float32 through dsoop.
//
//	go run ./examples/go/addone add_one.so
//
// Build add_one.so with `python examples/build_add_one.py add_one.so`; `make
// go-examples` does both, with the environment this needs (TVMDSOOP_LIBRARY_PATH and
// the cgo flags of build/cgo.mk).
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
