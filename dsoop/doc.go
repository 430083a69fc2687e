// Package dsoop loads TVM modules (libraries made by TVM's export_library, or any
// library exporting TVM-FFI functions) and calls their functions on DLPack tensors.
//
// The calls go through the C code in dsoop.c: Go resolves modules and functions
// once, and a call is a single C call of the TVM function pointer. The TensorFlow
// kernels use the same C code on their per-call path without entering Go.
//
// # Opening a library
//
// [Open] loads a library, or shares the one already loaded from the same
// unchanged file; [OpenPinned] also requires the library's SHA-256. The path must
// lie in the folders of [AllowedDirsEnv] when it is set. The file is read once
// into a sealed memory file, and nothing of it runs before that copy passes its
// checks: its digest (when pinned), its ELF structure, the CPU features it needs and, for a
// library without a pinned digest, a load in a separate process ([ProbeEnv]).
// TVM's loader then maps that same copy. The runtime libraries it needs
// (libtvm_ffi.so, and TVM's runtime for libraries made by tvm.compile) are
// found through [LibraryPathEnv] at the first Open ([Init]). Libraries built by
// TVM 0.8-0.20 are loaded by dsoop itself ([Module.Legacy]).
//
// # Calling
//
// [Module.Func] looks up a function once; [Func.Call] calls it, from any
// goroutine, on tensors and scalars, by TVM's destination-passing convention. A
// library that holds a whole model, a Relax VM executable ([Module.IsVM]), is
// called through [Module.VMFunc]: [VMFunc.Call] runs on a VM instance from the
// model's pool for the device ([VMInstancesEnv]) and returns its [Outputs].
//
// # Errors
//
// Failures wrap the package's sentinel errors (ErrDigestMismatch,
// ErrFunctionNotFound, ...): test for them with errors.Is. A failure that TVM
// reports is an [*Error], with TVM's error kind and message.
package dsoop
