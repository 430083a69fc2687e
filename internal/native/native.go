// Package native gives C holders inside this module (the TensorFlow kernels,
// dsoop's C-loop baseline) what dsoop keeps out of its public API: the native
// objects behind its functions, for the holder to call from C.
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

	// BorrowFunc writes fn's function object, fn a *dsoop.Func, into dst (a
	// DsoopFunction) with no new reference: it is valid while fn is open.
	BorrowFunc func(fn any, dst unsafe.Pointer) error

	// BorrowVMFunc gives the pool of VM instances and the index there of fn, a
	// *dsoop.VMFunc, with no new reference to the pool: it is valid while fn is open.
	BorrowVMFunc func(fn any) (pool unsafe.Pointer, index int32, err error)
)
