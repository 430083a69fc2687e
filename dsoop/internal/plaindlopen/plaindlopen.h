// plaindlopen.h: a library loaded with dlopen and nothing else, the baseline of
// dsoop's load benchmarks.
#ifndef TVMDSOOP_PLAINDLOPEN_H_
#define TVMDSOOP_PLAINDLOPEN_H_

// Opens the library at path with TVM's loader's flags and closes it. Returns
// NULL, or the loader's message.
const char* plaindlopen_open_close(const char* path);

#endif  // TVMDSOOP_PLAINDLOPEN_H_
