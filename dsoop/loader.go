package dsoop

/*
#include <stdlib.h>
#include "dsoop.h"
*/
import "C"

import (
	"fmt"
	"strings"
	"unsafe"
)

// loadModule loads the sealed library through TVM's loader. CUDA code in it
// needs TVM's CUDA runtime, which registers the loader of such code: it is opened
// first when no loader is registered yet.
func loadModule(s *sealedLibrary) (C.TVMFFIObjectHandle, error) {
	cuda, holdsCUDA := s.embeds(cudaKind)
	var cudaErr error
	if holdsCUDA && !hasGlobal(cudaLoaderName) {
		cudaErr = loadCUDARuntime()
	}
	cpath := C.CString(s.loadPath())
	defer C.free(unsafe.Pointer(cpath))
	var handle C.TVMFFIObjectHandle
	var cerr C.DsoopError
	if C.dsoop_module_load(cpath, &handle, &cerr) != 0 {
		err := takeError(&cerr)
		if !holdsCUDA && len(s.embedded) > 0 && tvmRuntimePath() == "" {
			return nil, fmt.Errorf("%w (%w: it embeds a %s module, which TVM's runtime loads; %s)", err,
				ErrTVMRuntimeNotLoaded, s.embedded[0].kind, tvmRuntimeHelp)
		}
		return nil, explainLoadFailure(err, cuda, cudaErr, hasGlobal)
	}
	if err := checkContextPointers(cpath, s.contextPointers); err != nil {
		C.dsoop_object_release(handle)
		return nil, err
	}
	// Before any call: its parallel loops run on dsoop's pool (parallel.c).
	C.dsoop_parallel_install(cpath)
	return handle, nil
}

// checkContextPointers refuses the library loaded from cpath when TVM's loader
// left one of its context pointers (names) unset: a call through it would jump
// to address zero. TVM's loader fills them with the functions TVM's runtime
// registers, so a library built by tvm.compile needs that runtime loaded.
func checkContextPointers(cpath *C.char, names []string) error {
	if len(names) == 0 {
		return nil
	}
	cnames := make([]*C.char, len(names))
	for i, name := range names {
		cnames[i] = C.CString(name)
		defer C.free(unsafe.Pointer(cnames[i]))
	}
	unset := C.dsoop_library_unset_pointer(cpath, &cnames[0], C.int32_t(len(cnames)))
	if unset < 0 {
		return nil
	}
	pointer := names[unset]
	function := strings.TrimPrefix(pointer, "__")
	runtime := tvmRuntimePath()
	if runtime == "" {
		return fmt.Errorf("%w: it calls %s through %s, which TVM's runtime fills; %s",
			ErrTVMRuntimeNotLoaded, function, pointer, tvmRuntimeHelp)
	}
	return fmt.Errorf("it calls %s through %s, which TVM's loader left unset: the TVM runtime %s provides "+
		"no %s; rebuild the library with the TVM of that runtime", function, pointer, runtime, function)
}
