package dsoop

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// libraryBinSymbol holds the modules a library carries serialized for TVM's
// loader to rebuild at load: device code, a Relax VM executable (tvm-ffi's
// include/tvm/ffi/extra/module.h, symbol::tvm_ffi_library_bin).
const libraryBinSymbol = ffiSymbolPrefix + "_library_bin"

// embeddedModule is one module of a library's libraryBinSymbol: its kind
// ("cuda", "relax.VMExecutable", ...) and, for CUDA code, the code's format
// ("cuda" for C++ source, "ptx", "cubin", "fatbin").
type embeddedModule struct {
	kind, format string
	// vmFunctions are a Relax VM executable's functions (vmExecutableKind), read
	// from its function table.
	vmFunctions []string
	// vmParams are the parameters' names of each of vmFunctions.
	vmParams map[string][]string
	// nativeFunctions are those of vmFunctions compiled to native code, which
	// trust the executable's tables (see checkLibraryBinDigest).
	nativeFunctions []string
}

// Bounds on what a library's serialized modules may claim, far above what TVM
// writes: a corrupt length must not make the reader allocate it.
const (
	maxEmbeddedModules = 1 << 16
	maxNameLength      = 256
)

// readEmbeddedModules lists the modules serialized in a library's
// libraryBinSymbol, read the way tvm-ffi's loader reads them
// (src/ffi/extra/library_module.cc, ProcessLibraryBin):
//
//	<nbytes: u64> <import tree: indptr vec<u64>, child indices vec<u64>>
//	then per module <kind: str> and, except for "_lib" (the library itself), <bytes: str>
//
// where a vec or str is a u64 count and then its items, all little-endian. A
// CUDA module's bytes begin with its code's format, a str (apache/tvm's
// src/runtime/cuda/cuda_module.cc, SaveToBytes). Module bytes other than that
// are skipped, not read: a model's constants may be large. A library without
// the symbol carries none.
func readEmbeddedModules(f *elf.File, symbols []elf.Symbol) ([]embeddedModule, error) {
	for _, sym := range symbols {
		if sym.Name != libraryBinSymbol || sym.Section == elf.SHN_UNDEF {
			continue
		}
		bin, err := symbolData(f, sym)
		if err != nil {
			return nil, err
		}
		modules, err := parseEmbeddedModules(bin)
		if err != nil {
			return nil, err
		}
		return modules, checkLibraryBinDigest(f, symbols, bin, modules)
	}
	return nil, nil
}

// parseEmbeddedModules reads the serialized modules from bin (see
// readEmbeddedModules).
func parseEmbeddedModules(bin io.ReaderAt) ([]embeddedModule, error) {
	r := &binReader{r: bin, limit: 8}
	if nbytes := r.u64(); nbytes > math.MaxUint64-8 {
		r.err = errors.New("bad length")
	} else {
		r.limit += nbytes
	}
	indptr := r.u64()
	if r.err == nil && (indptr == 0 || indptr > maxEmbeddedModules+1) {
		r.err = fmt.Errorf("an import tree of %d entries", indptr)
	}
	r.skipWords(indptr)
	r.skipWords(r.u64()) // the child indices
	var modules []embeddedModule
	for i := uint64(1); r.err == nil && i < indptr; i++ {
		kind := r.str()
		if kind == "_lib" {
			continue
		}
		m := embeddedModule{kind: kind}
		size := r.u64()
		start := r.off
		switch kind {
		case cudaKind:
			m.format = r.str()
		case vmExecutableKind:
			if size > r.left() {
				break // the skip below reports it
			}
			exec, err := readVMExecutable(&binReader{r: r.r, off: start, limit: start + size})
			if err != nil {
				return nil, fmt.Errorf("its Relax VM executable is malformed: %w", err)
			}
			m.vmFunctions, m.nativeFunctions = exec.vmFunctionNames(), exec.nativeFunctions()
			for _, f := range exec.functions {
				if f.entryPoint() {
					if m.vmParams == nil {
						m.vmParams = map[string][]string{}
					}
					m.vmParams[f.name] = f.params
				}
			}
		}
		if read := r.off - start; r.err == nil && read > size {
			r.err = fmt.Errorf("the %s module's %d bytes hold more", kind, size)
		}
		r.skip(size - (r.off - start))
		modules = append(modules, m)
	}
	if r.err != nil {
		return nil, fmt.Errorf("serialized modules: %w", r.err)
	}
	return modules, nil
}

// binReader reads little-endian u64s and strs from r, within its first limit
// bytes. The first failure sticks in err, and every read after it gives zero
// values.
type binReader struct {
	r     io.ReaderAt
	off   uint64
	limit uint64
	err   error
}

// left is how many bytes remain within the limit.
func (b *binReader) left() uint64 { return b.limit - b.off }

func (b *binReader) read(n uint64) []byte {
	if b.err == nil && n > b.left() {
		b.err = io.ErrUnexpectedEOF
	}
	if b.err != nil {
		return nil
	}
	buf := make([]byte, n)
	if _, err := b.r.ReadAt(buf, int64(b.off)); err != nil {
		b.err = err
		return nil
	}
	b.off += n
	return buf
}

func (b *binReader) u64() uint64 {
	if buf := b.read(8); buf != nil {
		return binary.LittleEndian.Uint64(buf)
	}
	return 0
}

// str reads a str: a kind or a format, short.
func (b *binReader) str() string { return b.strMax(maxNameLength) }

// strMax reads a str of at most max bytes.
func (b *binReader) strMax(max uint64) string {
	n := b.u64()
	if b.err == nil && n > max {
		b.err = fmt.Errorf("a name of %d bytes", n)
	}
	return string(b.read(n))
}

// skip moves past n bytes.
func (b *binReader) skip(n uint64) {
	if b.err == nil && n > b.left() {
		b.err = io.ErrUnexpectedEOF
	}
	if b.err == nil {
		b.off += n
	}
}

// skipWords moves past n u64s.
func (b *binReader) skipWords(n uint64) {
	if b.err == nil && n > b.left()/8 {
		b.err = io.ErrUnexpectedEOF
	}
	b.skip(8 * n)
}
