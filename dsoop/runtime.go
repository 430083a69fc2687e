package dsoop

/*
#cgo CFLAGS: -I${SRCDIR}/.. -I${SRCDIR}/../third_party/tvm-ffi/include
#cgo LDFLAGS: -ldl -lpthread
#include <stdlib.h>
#include "dsoop.h"
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"
)

// LibraryPathEnv names the environment variable listing the folders (separated by
// ':') that hold libtvm_ffi.so and, for tvm.compile'd modules, libtvm_runtime.so
// (and, for CUDA modules, libtvm_runtime_cuda.so and the CUDA runtime it links).
// The Python package sets it from the installed packages when unset.
const LibraryPathEnv = "TVMDSOOP_LIBRARY_PATH"

const (
	ffiLibraryName     = "libtvm_ffi.so"
	runtimeLibraryName = "libtvm_runtime.so"
	// TVM's CUDA runtime: it registers the loader of the CUDA code that
	// tvm.compile'd modules embed (ffi.Module.load_from_bytes.cuda). apache-tvm
	// ships it beside libtvm_runtime.so.
	cudaRuntimeLibraryName = "libtvm_runtime_cuda.so"
	// The CUDA runtime that apache-tvm 0.27's libtvm_runtime_cuda.so links, from
	// the nvidia-cuda-runtime package, say. Its RUNPATH is only its own folder, so
	// a copy found on the search path is opened first to satisfy it.
	cudartLibraryName = "libcudart.so.13"
)

// runtimeHelp says where the runtime libraries come from and how dsoop finds
// them: the fix for ErrRuntimeNotFound.
const runtimeHelp = "install the pip package apache-tvm-ffi and set " + LibraryPathEnv + " to the folder holding " +
	ffiLibraryName + ", its tvm_ffi/lib folder (`python -c \"import tvm_ffi.libinfo as l; print(l.find_libtvm_ffi())\"` " +
	"prints the library's path); for libraries made by tvm.compile, add the folder of " + runtimeLibraryName +
	", the tvm/lib folder of the pip package apache-tvm (`python -c \"import tvm.libinfo as l; print(l.find_libtvm_runtime())\"`)"

// tvmRuntimeHelp says how to get TVM's runtime: the fix for ErrTVMRuntimeNotLoaded.
const tvmRuntimeHelp = "install the pip package apache-tvm (tf_op's [tvm] extra) and add its tvm/lib folder to " +
	LibraryPathEnv + " (`python -c \"import tvm.libinfo as l; print(l.find_libtvm_runtime())\"` prints the library's path)"

// tvmRuntimePath is the TVM runtime Init opened; "" when it opened none.
func tvmRuntimePath() string {
	initMu.Lock()
	defer initMu.Unlock()
	return found.runtime
}

var (
	initMu  sync.Mutex
	initErr error
	inited  bool
	found   libraries // the libraries Init found, written under initMu
)

// Init opens the TVM-FFI runtime (and the TVM runtime when present) with
// RTLD_GLOBAL. Open calls it; call it yourself only to surface the error early.
// A failure is remembered: later calls return the same error.
func Init() error {
	initMu.Lock()
	defer initMu.Unlock()
	if inited {
		return initErr
	}
	inited = true
	initErr = initRuntime()
	return initErr
}

func initRuntime() error {
	searchPath := getenv(LibraryPathEnv)
	libs, err := findLibraries(searchPath)
	if err != nil {
		return err
	}
	cFFI, cRuntime := C.CString(libs.ffi), C.CString(libs.runtime)
	defer C.free(unsafe.Pointer(cFFI))
	defer C.free(unsafe.Pointer(cRuntime))
	// The version first: nothing else of a runtime of another version is called.
	var cerr C.DsoopError
	var cVersion C.TVMFFIVersion
	var file *C.char
	if C.dsoop_runtime_version(cFFI, &cVersion, &file, &cerr) != 0 {
		where := LibraryPathEnv + " is not set, and the dynamic loader did not find it"
		if searchPath != "" {
			where = "found through " + LibraryPathEnv + "=" + searchPath
		}
		return fmt.Errorf("dsoop: %w: %w (%s): %s", ErrRuntimeNotFound, takeError(&cerr), where, runtimeHelp)
	}
	have := version{uint32(cVersion.major), uint32(cVersion.minor), uint32(cVersion.patch)}
	if err := checkRuntimeVersion(C.GoString(file), have, builtVersion); err != nil {
		return err
	}
	if C.dsoop_runtime_init(cFFI, cRuntime, &cerr) != 0 {
		err := takeError(&cerr)
		return fmt.Errorf("dsoop: %w: %w", ErrRuntimeNotFound, err)
	}
	found = libs
	return nil
}

// version is a TVM-FFI version.
type version struct{ major, minor, patch uint32 }

func (v version) String() string { return fmt.Sprintf("%d.%d.%d", v.major, v.minor, v.patch) }

// builtVersion is the version of the TVM-FFI headers dsoop is compiled with
// (third_party/tvm-ffi).
var builtVersion = version{C.TVM_FFI_VERSION_MAJOR, C.TVM_FFI_VERSION_MINOR, C.TVM_FFI_VERSION_PATCH}

// checkRuntimeVersion refuses the runtime at file when its major.minor differs
// from built's; patch releases keep the C ABI.
func checkRuntimeVersion(file string, found, built version) error {
	if found.major == built.major && found.minor == built.minor {
		return nil
	}
	return fmt.Errorf("dsoop: %w: %s is TVM-FFI %s, dsoop was built with the headers of TVM-FFI %s, and the major.minor "+
		"versions must match: install apache-tvm-ffi %d.%d.x, or point %s at its tvm_ffi/lib folder",
		ErrRuntimeVersion, file, found, built, built.major, built.minor, LibraryPathEnv)
}

func loadExtension(path string) error {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var cerr C.DsoopError
	if C.dsoop_load_extension(cpath, &cerr) != 0 {
		return fmt.Errorf("cannot open %s: %s", path, takeError(&cerr).Message)
	}
	return nil
}

// hasGlobal reports whether the runtime has a global function of that name. A
// failure to ask counts as no: the answer only decides whether TVM's CUDA
// runtime is opened (once per process at most) and how a failed load is
// explained.
func hasGlobal(name string) bool {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var cerr C.DsoopError
	exists := C.dsoop_global_exists(cname, &cerr)
	if exists < 0 {
		C.dsoop_error_clear(&cerr)
	}
	return exists == 1
}

// libraries are the runtime libraries found on the search path; an empty name
// is one not found.
type libraries struct {
	ffi, runtime, cudaRuntime, cudart string
}

// findLibraries picks the runtime libraries from the folders of searchPath. With
// an empty search path it leaves the choice to the dynamic loader, which also finds
// a libtvm_ffi.so that the process has already loaded (as `import tvm_ffi` does).
// TVM's CUDA runtime is taken only from the folder of the TVM runtime it extends.
func findLibraries(searchPath string) (libraries, error) {
	if searchPath == "" {
		return libraries{ffi: ffiLibraryName}, nil
	}
	var libs libraries
	for _, dir := range filepath.SplitList(searchPath) {
		if dir == "" {
			continue
		}
		found := func(name string, into *string) {
			if *into == "" && isFile(filepath.Join(dir, name)) {
				*into = filepath.Join(dir, name)
			}
		}
		found(ffiLibraryName, &libs.ffi)
		found(cudartLibraryName, &libs.cudart)
		if libs.runtime == "" {
			found(runtimeLibraryName, &libs.runtime)
			if libs.runtime != "" {
				found(cudaRuntimeLibraryName, &libs.cudaRuntime)
			}
		}
	}
	if libs.ffi == "" {
		return libraries{}, fmt.Errorf("dsoop: %w in %s=%s: %s", ErrRuntimeNotFound, LibraryPathEnv, searchPath, runtimeHelp)
	}
	return libs, nil
}

// getenv reads the live C environment. Go's os.Getenv would not do here: in a
// c-shared library it sees the environment as it was at process start, not what
// the host (Python's os.environ, say) set before loading us.
func getenv(name string) string {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return C.GoString(C.getenv(cname))
}

func isFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}
