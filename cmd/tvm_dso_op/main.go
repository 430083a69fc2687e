// Command tvm_dso_op is the TensorFlow op library, built two ways (see
// CMakeLists.txt):
//
//   - go build -buildmode=c-shared: libtvm_dso_op.so, for tf.load_op_library;
//   - go build -buildmode=c-archive: libtvm_dso_op.a and libtvm_dso_op.h, for
//     binaries that link their custom ops in, as TensorFlow Serving does.
//
// Either way, linking it registers TVMDSOOp and TvmDsoOp (C++ static
// initialisers in the kernels package).
package main

// #include <stdlib.h>
import "C"

import _ "github.com/tvmdsoop/tvmdsoop/kernels"

// Version is the op library's version.
const Version = "0.1.0"

var versionC = C.CString(Version)

// TVMDSOOpVersion returns the op library's version: a static string, not to be
// freed. Servers that link the archive can log it to show the op is in.
//
//export TVMDSOOpVersion
func TVMDSOOpVersion() *C.char { return versionC }

func main() {}
