// tvmdsoop-probe: loads a library in a process of its own, so that a library
// whose loading crashes (a corrupted relocation, a constructor that aborts, a
// Relax VM executable whose bytes TVM's deserializer trips on) takes down this
// process rather than the one that asked. dsoop runs it on the sealed copy of a
// library that has no pinned digest, before loading it itself.
//
//   tvmdsoop-probe LIBTVM_FFI.so [LIBTVM_RUNTIME.so]     (the library on fd 3)
//
// The TVM runtime libraries are opened first, RTLD_GLOBAL, as the op opens them
// (dsoop_runtime_init, the op's own code): TVM's libraries resolve their symbols
// there. The library is then dlopen'ed, and loaded by TVM's loader as the op
// loads it (dsoop_module_load), which rebuilds the modules it embeds. Exit
// status 0 when the library loaded, 1 when a loader refused it (its message on
// stderr), 2 when the probe could not set up; a crash ends it by a signal.
#include <dlfcn.h>
#include <stdio.h>

#include "dsoop/dsoop.h"

static const char kLibrary[] = "/proc/self/fd/3";

// The module loaded, held to the exit as the op holds what it loads: a global,
// so that LeakSanitizer (make test-asan) sees it referenced. As a local of main
// it was a leak at exit, and the sanitized probe's report made it exit non-zero.
static TVMFFIObjectHandle module;

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: tvmdsoop-probe LIBTVM_FFI.so [LIBTVM_RUNTIME.so] (library on fd 3)\n");
    return 2;
  }
  DsoopError err = {NULL, NULL};
  if (argv[1][0] == '\0' || dsoop_runtime_init(argv[1], argc == 3 ? argv[2] : "", &err) != 0) {
    fprintf(stderr, "tvmdsoop-probe: %s\n", err.message != NULL ? err.message : "no TVM-FFI runtime named");
    dsoop_error_clear(&err);
    return 2;
  }
  if (dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL) == NULL) {
    fprintf(stderr, "tvmdsoop-probe: %s\n", dlerror());
    return 1;
  }
  if (dsoop_module_load(kLibrary, &module, &err) != 0) {
    fprintf(stderr, "tvmdsoop-probe: %s: %s\n", err.kind != NULL ? err.kind : "Error",
            err.message != NULL ? err.message : "");
    dsoop_error_clear(&err);
    return 1;
  }
  return 0;
}
