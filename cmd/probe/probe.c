// tvmdsoop-probe: loads a library in a process of its own, so that a library
// whose loading crashes (a corrupted relocation, a constructor that aborts)
// takes down this process rather than the one that asked. dsoop runs it on the
// sealed copy of a library that has no pinned digest, before loading it itself.
//
//   tvmdsoop-probe LIBTVM_FFI.so [LIBTVM_RUNTIME.so]     (the library on fd 3)
//
// The TVM runtime libraries are opened first, RTLD_GLOBAL, as the op opens them:
// TVM's libraries resolve their symbols there. Exit status 0 when the library
// loaded, 1 when the loader refused it (its message on stderr), 2 when the probe
// could not set up; a crash ends it by a signal.
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: tvmdsoop-probe LIBTVM_FFI.so [LIBTVM_RUNTIME.so] (library on fd 3)\n");
    return 2;
  }
  for (int i = 1; i < argc; ++i) {
    if (argv[i][0] != '\0' && dlopen(argv[i], RTLD_NOW | RTLD_GLOBAL) == NULL) {
      fprintf(stderr, "tvmdsoop-probe: %s\n", dlerror());
      return 2;
    }
  }
  if (dlopen("/proc/self/fd/3", RTLD_NOW | RTLD_LOCAL) == NULL) {
    fprintf(stderr, "tvmdsoop-probe: %s\n", dlerror());
    return 1;
  }
  return 0;
}
