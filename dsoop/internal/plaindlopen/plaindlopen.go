// Package plaindlopen loads a library with dlopen and nothing else: the baseline
// that dsoop's load-time checks (read, digest, ELF checks, sealed copy, probe)
// are measured against.
package plaindlopen

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "plaindlopen.h"
*/
import "C"

import (
	"errors"
	"unsafe"
)

// OpenClose opens the library at path with dlopen, as TVM's loader does, and
// closes it: a library no one else holds is unmapped, so the next call loads
// it anew.
func OpenClose(path string) error {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	if msg := C.plaindlopen_open_close(cpath); msg != nil {
		return errors.New(C.GoString(msg))
	}
	return nil
}
