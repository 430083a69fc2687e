// plaindlopen.c: see plaindlopen.h.
#include "plaindlopen.h"

#include <dlfcn.h>
#include <stddef.h>

const char* plaindlopen_open_close(const char* path) {
  void* handle = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
  if (handle == NULL) return dlerror();
  dlclose(handle);
  return NULL;
}
