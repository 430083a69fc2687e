package dsoop

/*
#include <stdlib.h>
#include "dsoop.h"
#include "vm.h"
#include "legacy.h"
*/
import "C"

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

// AllowedDirsEnv names the environment variable that, when set, lists (separated
// by ':') the only folders libraries may be loaded from. Loading a library runs
// its code: this keeps a model from loading one from anywhere else.
const AllowedDirsEnv = "TVMDSOOP_ALLOWED_DIRS"

// Module is an open TVM module. A library is loaded once per process per path:
// every Open of the same file shares one loaded module, which is released when
// the last Module opened on it is closed. Close a Module when done; a finaliser
// closes it otherwise. Funcs keep their library loaded on their own, so closing a
// Module does not invalidate the Funcs taken from it.
type Module struct {
	entry *moduleEntry
	ref   *moduleRef
}

// moduleRef is a Module's open of its entry, apart from Module so that the
// finaliser (a cleanup on Module) can close it without resurrecting Module.
type moduleRef struct {
	mu     sync.RWMutex // Close waits for lookups in flight
	entry  *moduleEntry
	closed bool
}

// moduleEntry is one loaded library, shared by the Modules opened on its path.
type moduleEntry struct {
	path   string
	stat   os.FileInfo               // of the file the library was read from, then
	sealed *sealedLibrary            // the copy it was loaded from: its digest, its data symbols
	handle C.TVMFFIObjectHandle      // the module TVM's loader made; nil for a legacy library
	legacy *C.DsoopLegacyLibrary     // a library of TVM 0.8-0.20, loaded by legacy.c; else nil
	isVM   bool                      // holds a Relax VM executable (a whole model)
	pools  map[dlpack.Device]*vmPool // the model's VM instances by device; guarded by poolsMu
	opens  int                       // guarded by modulesMu
	kept   bool                      // one of opens is native.KeepLoaded's; guarded by modulesMu

	funcsMu sync.Mutex
	funcs   map[string]C.DsoopFunction // looked up so far, one object per name, released with the entry
}

var (
	modulesMu sync.Mutex
	modules   = map[string]*moduleEntry{} // the latest entry loaded from each path
	// loading serialises the Opens of each path, and only of that path: a large
	// library being read, hashed, probed and loaded stalls no Open of another.
	loading = map[string]*pathLock{} // guarded by modulesMu
)

// pathLock is held by the Open of a path in progress; others of the path wait.
type pathLock struct {
	mu      sync.Mutex
	waiters int // the Opens holding or waiting for mu; guarded by modulesMu
}

// lockPath waits for the Opens of path in progress, and returns the unlock.
func lockPath(path string) (unlock func()) {
	modulesMu.Lock()
	l := loading[path]
	if l == nil {
		l = &pathLock{}
		loading[path] = l
	}
	l.waiters++
	modulesMu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		modulesMu.Lock()
		defer modulesMu.Unlock()
		if l.waiters--; l.waiters == 0 {
			delete(loading, path)
		}
	}
}

// newModule makes a Module of one more open of e, which is counted already.
func newModule(e *moduleEntry) *Module {
	m := &Module{entry: e, ref: &moduleRef{entry: e}}
	runtime.AddCleanup(m, (*moduleRef).close, m.ref)
	return m
}

// Open loads the TVM module at path, or shares the one already loaded from it.
func Open(path string) (*Module, error) { return OpenPinned(path, "") }

// OpenPinned is Open for a library that must have the SHA-256 sha256 (hex; ""
// for any). The file is read once into a sealed memory file, and its digest and
// ELF structure are checked there before anything of it runs; the loader then
// maps that same copy, so nothing done to the file on disk afterwards changes
// what runs. A mismatch is ErrDigestMismatch, naming both digests.
//
// A path already loaded is shared while its file is unchanged (same size,
// modification time and inode); a changed file (a library rebuilt in place) is
// loaded anew, and the old copy stays with whoever holds it.
func OpenPinned(path, sha256 string) (*Module, error) {
	if strings.ContainsRune(path, 0) {
		return nil, fmt.Errorf("dsoop: library path %q holds a NUL byte", path)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("dsoop: library %q: %w", path, err)
	}
	// Checked at every Open, not only the first: the allow-list may have changed.
	if err := checkAllowed(abs, getenv(AllowedDirsEnv)); err != nil {
		return nil, err
	}
	// Checked here so that the common mistakes get clear errors, not the loader's.
	st, err := os.Stat(abs)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("dsoop: library %s: %w", abs, fs.ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("dsoop: library %s: %w", abs, err)
	}
	if !st.Mode().IsRegular() {
		// A directory, a device or a FIFO: reading one to hash it could block forever.
		return nil, fmt.Errorf("dsoop: library %s is not a regular file (%s)", abs, st.Mode().Type())
	}
	defer lockPath(abs)()
	if m, err := openLoaded(abs, st, sha256); m != nil || err != nil {
		return m, err
	}
	sealed, err := sealLibrary(abs)
	if err != nil {
		return nil, fmt.Errorf("dsoop: library %s: %w", abs, err)
	}
	// The memfd stays open for the life of the process: the loaded library is
	// mapped from it, and backtraces read the library through its path.
	if err := checkDigest(abs, sealed.digest, sha256); err != nil {
		sealed.close()
		return nil, err
	}
	if err := Init(); err != nil {
		sealed.close()
		return nil, err
	}
	// A library without a pinned digest is tried in a separate process first; a
	// pinned one is the library the model was built with.
	if sha256 == "" {
		initMu.Lock()
		libs := found
		initMu.Unlock()
		if err := probe(sealed, libs); err != nil {
			sealed.close()
			return nil, fmt.Errorf("dsoop: library %s: %w", abs, err)
		}
	}
	if sealed.legacy != nil {
		lib, err := openLegacy(sealed, abs)
		if err != nil {
			sealed.close()
			return nil, fmt.Errorf("dsoop: cannot load library %s: %w", abs, err)
		}
		return addEntry(&moduleEntry{path: abs, stat: st, sealed: sealed, legacy: lib, opens: 1}), nil
	}
	handle, err := loadModule(sealed)
	if err != nil {
		sealed.close()
		return nil, fmt.Errorf("dsoop: cannot load library %s: %w", abs, err)
	}
	var cerr C.DsoopError
	isVM := C.dsoop_module_is_vm(handle, &cerr)
	if isVM < 0 {
		C.dsoop_object_release(handle)
		sealed.close() // the library goes unused: its memfd need not outlive this call
		return nil, fmt.Errorf("dsoop: library %s: %w", abs, takeError(&cerr))
	}
	return addEntry(&moduleEntry{path: abs, stat: st, sealed: sealed, handle: handle, isVM: isVM == 1, opens: 1}), nil
}

// addEntry records a library just loaded as its path's, and opens it.
func addEntry(e *moduleEntry) *Module {
	modulesMu.Lock()
	modules[e.path] = e
	modulesMu.Unlock()
	return newModule(e)
}

// openLoaded opens the library already loaded from path when its file is still
// the one st describes; nil and no error when there is none.
func openLoaded(path string, st os.FileInfo, sha256 string) (*Module, error) {
	modulesMu.Lock()
	defer modulesMu.Unlock()
	e, ok := modules[path]
	if !ok || !sameFile(e.stat, st) {
		return nil, nil
	}
	if err := checkDigest(path, e.sealed.digest, sha256); err != nil {
		return nil, err
	}
	e.opens++
	return newModule(e), nil
}

// checkDigest refuses a library whose digest is not want (when want is set).
func checkDigest(path, digest, want string) error {
	if want == "" || strings.EqualFold(digest, want) {
		return nil
	}
	return fmt.Errorf("%w: the library at %s has SHA-256 %s, the model expects %s", ErrDigestMismatch, path, digest, want)
}

// sameFile reports whether two stats of a path are of the same, unchanged file.
func sameFile(a, b os.FileInfo) bool {
	if a.Size() != b.Size() || !a.ModTime().Equal(b.ModTime()) {
		return false
	}
	as, aok := a.Sys().(*syscall.Stat_t)
	bs, bok := b.Sys().(*syscall.Stat_t)
	return !aok || !bok || (as.Dev == bs.Dev && as.Ino == bs.Ino)
}

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

// explainLoadFailure says what stopped TVM's loader when a library holds CUDA
// code (cuda is its embedded module; none for other libraries), from what the
// library holds and which steps before the load failed, never from TVM's
// wording: TVM's CUDA runtime did not open (cudaErr), or the code is CUDA source
// and nothing in the process compiles it (exists tells the runtime's global
// functions). Other failures pass unchanged.
func explainLoadFailure(err *Error, cuda embeddedModule, cudaErr error, exists func(name string) bool) error {
	switch {
	case cuda.kind == "":
		return err
	case cudaErr != nil:
		return fmt.Errorf("%w (the library holds CUDA code, and %w: %v)", err, ErrCUDARuntimeNotLoaded, cudaErr)
	case cuda.format == cudaSourceFormat && !exists(cudaCompileCallback):
		return fmt.Errorf("%w (%w: compile it with TVM where a CUDA driver is, see docs/gpu.md)", err, ErrCUDASourceNotCompiled)
	default:
		return err
	}
}

// Path is the absolute path the module was loaded from.
func (m *Module) Path() string { return m.entry.path }

// SHA256 is the hex SHA-256 of the bytes loaded: the file as read into the sealed copy.
func (m *Module) SHA256() string { return m.entry.sealed.digest }

// FileSHA256 is the hex SHA-256 of a file's contents, read in a stream.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// checkAllowed refuses a library outside the folders of allowed (':'-separated);
// an empty allowed permits every folder. Symbolic links are resolved first, so a
// link inside an allowed folder cannot point outside it.
func checkAllowed(path, allowed string) error {
	if allowed == "" {
		return nil
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fmt.Errorf("dsoop: library %s: %w", path, err)
	}
	for _, dir := range filepath.SplitList(allowed) {
		if dir == "" {
			continue
		}
		// Relative to what? The working directory of a server is no policy.
		if !filepath.IsAbs(dir) {
			return fmt.Errorf("dsoop: %w: %s=%s holds %q, which is not an absolute path", ErrNotAllowed, AllowedDirsEnv, allowed, dir)
		}
		realDir, err := filepath.EvalSymlinks(dir)
		if err != nil {
			continue // a folder that does not exist allows nothing
		}
		if rel, err := filepath.Rel(realDir, real); err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return nil
		}
	}
	return fmt.Errorf("dsoop: %w: %s is not in %s=%s", ErrNotAllowed, real, AllowedDirsEnv, allowed)
}

// ffiSymbolPrefix begins the symbol of every function a library exports to
// TVM-FFI (TVM_FFI_DLL_EXPORT_TYPED_FUNC, tvm.compile's functions).
const ffiSymbolPrefix = "__tvm_ffi_"

// reservedNames and reservedPrefixes are the names whose __tvm_ffi_<name>
// symbol TVM keeps for itself. From apache-tvm-ffi's include/tvm/ffi/extra/module.h
// (namespace symbol: "special symbols have one extra _ prefix to avoid conflict
// with user symbols"), function.h and extra/cuda/cubin_launcher.h:
//   - __tvm_ffi__library_ctx, __tvm_ffi__library_bin: the library's context
//     pointer and its embedded modules (data);
//   - __tvm_ffi__metadata_<f>, __tvm_ffi__doc_<f>: getters of a function's type
//     schema and docstring (TVM_FFI_DLL_EXPORT_TYPED_FUNC), not the function;
//   - __tvm_ffi__cubin_<name>: CUDA binaries embedded with TVM_FFI_EMBED_CUBIN (data).
//
// TVM 0.21 named the first two __tvm_ffi_library_ctx and __tvm_ffi_library_bin
// (include/tvm/runtime/module.h at v0.21.0), which the same lookup reaches as
// "library_ctx" and "library_bin". TVM up to 0.21 looked symbols up by their
// bare names, and its own are all __tvm... (__tvm_main__, __tvm_module_ctx,
// __tvm_dev_mblob, __tvm_set_device, ...: v0.20.0's module.h); C reserves names
// beginning with two underscores for the implementation, so none is a user's.
//
// "main" (__tvm_ffi_main) is not reserved: it is the module's entry function,
// code that tvm.compile exports for its user.
var (
	reservedNames    = map[string]bool{"_library_ctx": true, "_library_bin": true, "library_ctx": true, "library_bin": true}
	reservedPrefixes = []string{"_metadata_", "_doc_", "_cubin_", "__tvm"}
)

// isReservedName reports whether name reaches a symbol TVM keeps for itself.
func isReservedName(name string) bool {
	return reservedNames[name] || slices.ContainsFunc(reservedPrefixes, func(p string) bool { return strings.HasPrefix(name, p) })
}

// Func looks up a function of the module (or of the modules it imports). A name
// TVM keeps for its own symbols is refused with ErrReservedName, and one whose
// symbol is data with ErrNotCode.
func (m *Module) Func(name string) (*Func, error) {
	if name == "" || strings.ContainsRune(name, 0) {
		return nil, fmt.Errorf("dsoop: library %s: bad function name %q", m.entry.path, name)
	}
	if isReservedName(name) {
		return nil, fmt.Errorf("dsoop: library %s: %q: %w (TVM-FFI looks it up as %s%s)", m.entry.path, name, ErrReservedName, ffiSymbolPrefix, name)
	}
	if m.entry.sealed.notCode[name] {
		return nil, fmt.Errorf("dsoop: library %s: %q: %w (%s%s)", m.entry.path, name, ErrNotCode, ffiSymbolPrefix, name)
	}
	m.ref.mu.RLock()
	defer m.ref.mu.RUnlock()
	if m.ref.closed {
		return nil, fmt.Errorf("dsoop: library %s: %w", m.entry.path, ErrClosed)
	}
	fn, found, err := m.entry.function(name)
	switch {
	case err != nil:
		return nil, fmt.Errorf("dsoop: library %s: function %q: %w", m.entry.path, name, err)
	case !found:
		return nil, fmt.Errorf("dsoop: library %s: %w: %q", m.entry.path, ErrFunctionNotFound, name)
	}
	return newFunc(name, m.entry.path, fn), nil
}

// function gives a new reference to the library's function name. The module is
// asked once per name: later lookups share its function object, so that the
// TensorFlow kernels of one function, however many, call through one object
// that stays in cache (a call reads the object's function pointer).
func (e *moduleEntry) function(name string) (fn C.DsoopFunction, found bool, err error) {
	e.funcsMu.Lock()
	defer e.funcsMu.Unlock()
	fn, found = e.funcs[name]
	if !found {
		if fn, found, err = e.lookUp(name); !found || err != nil {
			return fn, found, err
		}
		if e.funcs == nil {
			e.funcs = map[string]C.DsoopFunction{}
		}
		e.funcs[name] = fn // the entry's reference
	}
	C.dsoop_object_retain(fn.handle)
	return fn, true, nil
}

// lookUp asks the library for a new function object: TVM's loader's module, or
// legacy.c for a library of TVM 0.8-0.20.
func (e *moduleEntry) lookUp(name string) (fn C.DsoopFunction, found bool, err error) {
	// Of a legacy library, only the functions it exports itself: its loader would
	// also find its data, and the functions of the libraries it links (libc's).
	if e.legacy != nil && !e.sealed.legacy.functions[name] {
		return fn, false, nil
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var cerr C.DsoopError
	if e.legacy != nil {
		if C.dsoop_legacy_get_function(e.legacy, cname, &fn, &cerr) != 0 {
			return fn, false, takeError(&cerr)
		}
		return fn, true, nil
	}
	switch C.dsoop_module_get_function(e.handle, cname, &fn, &cerr) {
	case 0:
		return fn, false, nil
	case 1:
		cpath := C.CString(e.sealed.loadPath()) // what TVM's loader opened
		defer C.free(unsafe.Pointer(cpath))
		C.dsoop_function_use_symbol(e.handle, cpath, cname, &fn)
		return fn, true, nil
	default:
		return fn, false, takeError(&cerr)
	}
}

// Close releases this Module; the library is released with the last one open on
// its path. Close is idempotent.
func (m *Module) Close() error {
	m.ref.close()
	return nil
}

func (r *moduleRef) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	modulesMu.Lock()
	defer modulesMu.Unlock()
	e := r.entry
	e.opens--
	if e.opens > 0 {
		return
	}
	if modules[e.path] == e { // not if a rebuilt file replaced it there
		delete(modules, e.path)
	}
	poolsMu.Lock()
	pools := e.pools
	e.pools = nil
	poolsMu.Unlock()
	for _, p := range pools {
		p.release() // VMFuncs still open keep theirs
	}
	e.funcsMu.Lock()
	funcs := e.funcs
	e.funcs = nil
	e.funcsMu.Unlock()
	for _, fn := range funcs {
		C.dsoop_object_release(fn.handle) // Funcs still open keep theirs
	}
	if e.legacy != nil {
		C.dsoop_legacy_release(e.legacy) // its Funcs still open keep it loaded
		return
	}
	C.dsoop_object_release(e.handle)
}
