// Command tvm_dso_op is the TensorFlow op library libtvm_dso_op.so, built with
// `go build -buildmode=c-shared` (see CMakeLists.txt). Loading it with
// tf.load_op_library registers TVMDSOOp; it has no main logic of its own.
package main

import _ "github.com/tvmdsoop/tvmdsoop/kernels"

func main() {}
