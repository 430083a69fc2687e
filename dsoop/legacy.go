package dsoop

/*
#include <stdlib.h>
#include "legacy.h"
*/
import "C"

import (
	"debug/elf"
	"fmt"
	"strings"
	"unsafe"
)

// legacyDevBlobSymbol holds the modules a library of TVM <= 0.20 embeds (device
// code, such as CUDA kernels; relay.build's graph executor factory; the import
// tree), serialized for the old runtime to rebuild (readLegacyBlob reads them).
const legacyDevBlobSymbol = "__tvm_dev_mblob"

// legacyMarkers are symbols that only libraries of TVM <= 0.20 define: the name
// of the entry function, the module context pointer, the embedded modules.
var legacyMarkers = map[string]bool{"__tvm_main__": true, "__tvm_module_ctx": true, legacyDevBlobSymbol: true}

// legacyABI is what the dynamic symbols of a library built by TVM 0.8-0.21 say:
// such a library exports its functions under their own names, and calls back
// into its runtime through context pointers.
type legacyABI struct {
	functions map[string]bool // the functions it exports
	context   []string        // its context pointers, for dsoop_legacy_open to fill
	devBlob   bool            // it embeds modules (__tvm_dev_mblob)
	// tvm021: built by TVM 0.21, whose functions, under their own names, take
	// TVM-FFI's calling convention, with context symbols of both ABIs.
	tvm021 bool
}

// tvm021Symbols are the names TVM 0.21 gave a library's module context and
// embedded modules; tvm-ffi's loader looks for __tvm_ffi__library_ctx and
// __tvm_ffi__library_bin today.
var tvm021Symbols = map[string]bool{"__tvm_ffi_library_ctx": true, "__tvm_ffi_library_bin": true}

// readLegacyABI tells a library of TVM 0.8-0.21 from its defined dynamic
// symbols: a legacy marker or context pointer (or TVM 0.21's module context),
// and no function exported to TVM-FFI (__tvm_ffi_<name>: TVM >= 0.22, and
// libraries of tvm-ffi, which TVM's own loader loads). nil for any other library.
func readLegacyABI(symbols []elf.Symbol) *legacyABI {
	abi := &legacyABI{functions: map[string]bool{}}
	marked, ffi := false, false
	for _, sym := range symbols {
		if sym.Section == elf.SHN_UNDEF {
			continue
		}
		code := isCode(sym)
		exported := elf.ST_BIND(sym.Info) == elf.STB_GLOBAL || elf.ST_BIND(sym.Info) == elf.STB_WEAK
		switch {
		case tvm021Symbols[sym.Name]:
			abi.tvm021 = true
		case strings.HasPrefix(sym.Name, ffiSymbolPrefix):
			ffi = true
		case legacyMarkers[sym.Name]:
			marked = true
			abi.devBlob = abi.devBlob || sym.Name == legacyDevBlobSymbol
			if sym.Name == "__tvm_module_ctx" {
				abi.context = append(abi.context, sym.Name)
			}
		case isContextPointer(sym):
			marked = true
			abi.context = append(abi.context, sym.Name)
		case code && exported && !strings.HasPrefix(sym.Name, "__"):
			// Names beginning with "__" are the compiler's (__truncsfhf2 and the like).
			abi.functions[sym.Name] = true
		}
	}
	if ffi || !(marked || abi.tvm021) {
		return nil
	}
	return abi
}

// openLegacy loads the sealed copy of a library of TVM 0.8-0.20 (path is the
// user's name of it) with its context pointers filled. What it embeds
// (__tvm_dev_mblob) was read by readLegacyBlobOf: nothing of it but a graph
// executor factory, which openLegacyModel runs, and the import tree.
func openLegacy(s *sealedLibrary, path string) (*C.DsoopLegacyLibrary, error) {
	abi := s.legacy
	if abi.tvm021 {
		return nil, fmt.Errorf("%w: it was built by TVM 0.21, whose functions take TVM-FFI's calling convention under "+
			"their own names, which neither today's TVM-FFI loader nor dsoop's loader of older libraries calls: "+
			"rebuild it with TVM >= 0.22", ErrLegacyUnsupported)
	}
	cpath, cname := C.CString(s.loadPath()), C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	defer C.free(unsafe.Pointer(cname))
	context := make([]*C.char, len(abi.context))
	for i, name := range abi.context {
		context[i] = C.CString(name)
		defer C.free(unsafe.Pointer(context[i]))
	}
	var contextPtr **C.char
	if len(context) > 0 {
		contextPtr = &context[0]
	}
	var lib *C.DsoopLegacyLibrary
	var cerr C.DsoopError
	switch C.dsoop_legacy_open(cpath, cname, contextPtr, C.int(len(context)), &lib, &cerr) {
	case 0:
		return lib, nil
	case C.kDsoopLegacyNeedsRuntime:
		return nil, fmt.Errorf("%w: %s: %s", ErrTVMRuntimeNotLoaded, takeError(&cerr).Message, tvmRuntimeHelp)
	case C.kDsoopLegacyUnsupported:
		return nil, fmt.Errorf("%w: %w", ErrLegacyUnsupported, takeError(&cerr))
	default:
		return nil, takeError(&cerr)
	}
}

// Legacy reports whether the module is a library built by TVM 0.8-0.20, whose
// functions dsoop calls through the legacy calling convention.
func (m *Module) Legacy() bool { return m.entry.legacy != nil }
