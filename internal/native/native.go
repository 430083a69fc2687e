// Package native gives C holders inside this module (the TensorFlow kernels,
// dsoop's C-loop baseline) what dsoop keeps out of its public API: native
// references to its functions, whose lifetimes the holder then manages in C.
//
// Package dsoop sets these functions when it is initialised, and nothing else
// sets them. This package cannot name dsoop's types (dsoop imports it), so they
// take them as any; a value of another type is an error.
package native

import "unsafe"

var (
	// RetainFunc writes a new reference to fn, a *dsoop.Func, into dst, which must
	// point to a DsoopFunction (dsoop/dsoop.h). The holder owns the reference and
	// releases it with dsoop_object_release(dst->handle).
	RetainFunc func(fn any, dst unsafe.Pointer) error

	// RetainVMFunc gives the pool of VM instances and the index there of fn, a
	// *dsoop.VMFunc, with a reference to the pool that is never returned: the pool
	// then lives as long as the process.
	RetainVMFunc func(fn any) (pool unsafe.Pointer, index int32, err error)
)
