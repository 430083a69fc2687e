// Package native gives C holders inside this module (the TensorFlow kernels,
// dsoop's C-loop baseline) what dsoop keeps out of its public API: native
// references to its functions, whose lifetimes the holder then manages in C, and
// a library kept loaded for the life of the process.
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

	// KeepLoaded keeps the library of module, a *dsoop.Module, loaded for the
	// life of the process, as if a Module on it were never closed: later Opens
	// of the unchanged file share it (and a model's VM instances), and closing
	// module, or letting it go, does not unload it.
	KeepLoaded func(module any) error
)
