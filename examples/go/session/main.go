// Command session runs a TensorFlow graph that mixes TF ops and a TVM function,
// in a Go TF session (github.com/wamuir/graft).
//
//	. build/env.sh && go run ./examples/go/session add_one.so
//
// The TF Go bindings need TensorFlow's headers and C library: build/env.sh,
// written by `make build`, sets the cgo flags for the project's TensorFlow and
// the TVM runtime's TVMDSOOP_LIBRARY_PATH (docs/go.md). Importing tfbridge
// links the TVMDSOOp kernels into this binary; it never loads the c-shared op
// library.
package main

import (
	"fmt"
	"log"
	"os"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tvmdsoop/tvmdsoop/tfbridge"
)

func main() {
	if len(os.Args) != 2 {
		log.Fatal("usage: session LIBRARY.so")
	}
	module, err := tfbridge.NewModule(os.Args[1])
	if err != nil {
		log.Fatal(err)
	}
	addOne, err := module.Func("add_one")
	if err != nil {
		log.Fatal(err)
	}

	// y = sum(add_one(x * 10))
	s := op.NewScope()
	x := op.Placeholder(s, tf.Float, op.PlaceholderShape(tf.MakeShape(-1)))
	scaled := op.Mul(s, x, op.Const(s.SubScope("ten"), float32(10)))
	plusOne := addOne.Call(s, scaled)
	if err := s.Err(); err != nil {
		log.Fatal(err)
	}
	total := op.Sum(s, plusOne[0], op.Const(s.SubScope("axis"), int32(0)))
	graph, err := s.Finalize()
	if err != nil {
		log.Fatal(err)
	}

	session, err := tf.NewSession(graph, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer session.Close()
	input, err := tf.NewTensor([]float32{1, 2, 3})
	if err != nil {
		log.Fatal(err)
	}
	out, err := session.Run(map[tf.Output]*tf.Tensor{x: input}, []tf.Output{plusOne[0], total}, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("x:                  ", input.Value())
	fmt.Println("add_one(10 * x):    ", out[0].Value())
	fmt.Println("sum(add_one(10 * x)):", out[1].Value())
}
