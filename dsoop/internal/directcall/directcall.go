// Package directcall calls a dsoop function from a C loop, with no Go per call:
// the baseline that the Go binding's per-call cost is measured against.
package directcall

/*
#cgo CFLAGS: -I${SRCDIR}/../../.. -I${SRCDIR}/../../../third_party/tvm-ffi/include
#include <stdlib.h>
#include "directcall.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
	"github.com/tvmdsoop/tvmdsoop/internal/native"
)

// Loop calls f(x, y) iters times from C, on float32 vectors of n elements.
func Loop(f *dsoop.Func, n, iters int64) error {
	var fn C.DsoopFunction
	if err := native.RetainFunc(f, unsafe.Pointer(&fn)); err != nil {
		return err
	}
	defer C.dsoop_object_release(fn.handle)
	var cerr C.DsoopError
	if C.directcall_loop(&fn, C.int64_t(n), C.int64_t(iters), &cerr) != 0 {
		defer C.dsoop_error_clear(&cerr)
		return fmt.Errorf("directcall: %s: %s", C.GoString(cerr.kind), C.GoString(cerr.message))
	}
	return nil
}
