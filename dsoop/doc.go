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
// TVM 0.8-0.20 are loaded by dsoop itself ([Module.Legacy]), and their
// relay.build models run on dsoop's own graph executor: a library with its
// factory module embedded (export_library of relay.build's result), or a
// library with its graph JSON and params ([Module.Graph]).
//
// # Calling
//
// [Module.Func] looks up a function once; [Func.Call] calls it, from any
// goroutine, on tensors and scalars, by TVM's destination-passing convention. A
// library that holds a whole model ([Module.IsModel]: a Relax VM executable, or
// a relay.build graph) is called through [Module.VMFunc]: [VMFunc.Call] runs on
// an instance from the model's pool for the device ([VMInstancesEnv]) and
// returns its [Outputs].
//
// # Errors
//
// Failures wrap the package's sentinel errors (ErrDigestMismatch,
// ErrFunctionNotFound, ...): test for them with errors.Is. A failure that TVM
// reports is an [*Error], with TVM's error kind and message.
package dsoop

// Where each concern of the package lives:
//
//   - errors.go: every sentinel error, Error and FunctionNotFoundError.
//   - runtime.go: finding and opening the runtime libraries (Init).
//   - open.go: Open and OpenPinned, the libraries loaded by path, the lock that
//     serialises the Opens of one path, and digest pinning.
//   - allowlist.go: the folders libraries may be loaded from.
//   - sealed.go: a library's sealed copy and the checks of its ELF structure;
//     cpuflags.go: the CPU features it needs; embedded.go: the modules it
//     carries for TVM's loader; vmexecutable.go: a model's Relax VM executable,
//     read and verified; probe.go: its load in a separate process.
//   - loader.go: the load through TVM's loader, and the check of what it left unset.
//   - legacy.go: libraries of TVM 0.8-0.21 (legacy.c loads those it runs).
//   - legacy_graphjson.go, legacy_params.go: the graphs, params and embedded
//     modules (__tvm_dev_mblob) of relay.build's models, read and verified;
//     legacy_graph.go: their plan, handed to legacy_graph.c, the executor.
//   - cuda.go: libraries holding CUDA code: TVM's CUDA runtime, opened when one
//     first needs it; why their load failed; their models refused on the CPU.
//   - module.go: Module, its lifetime and the lookup of its functions.
//   - func.go, frame.go: Func, and a call's arguments in C memory.
//   - vmpool.go: a model's pools of VM instances, one per device (vm.c), or
//     of graph executor instances (a relay.build model's, on the CPU).
//   - vmfunctions.go: the list of a model's functions.
//   - vm.go: VMFunc and the call of a model's function.
//   - native.go: what the TensorFlow kernels reach through internal/native.
//   - dsoop.c, goapi.c, vm.c, legacy.c, legacy_graph.c: the C side, with no Go
//     on its call path.
