package dsoop

/*
#include <stdlib.h>
#include "dsoop.h"
*/
import "C"

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// sealedLibrary is a library's bytes, read once from its file into a sealed
// memory file (memfd): what was hashed and checked is exactly what the loader
// maps, and nothing done to the file on disk afterwards (an overwrite, a
// truncation, a deletion) changes or breaks what runs.
type sealedLibrary struct {
	file    *os.File // the memfd; open while the loader lists a library loaded from it (loaderFiles)
	size    int64
	digest  string          // hex SHA-256 of the bytes
	notCode map[string]bool // names whose __tvm_ffi_<name> symbol is not a function
	// functions are the names whose __tvm_ffi_<name> symbol is a function and
	// not one TVM keeps for itself (isReservedName), sorted: what a library of
	// plain functions offers, as its symbols say.
	functions []string
	// cpuFlags are the CPU features the library records using (cpuFlagsSymbol);
	// nil when it records none.
	cpuFlags []string
	// contextPointers are the pointers the library calls through that the runtime
	// fills at load (isContextPointer): checked once it is loaded.
	contextPointers []string
	// embedded are the modules the library carries for TVM's loader to rebuild,
	// as far as they could be read: what the loader will need (TVM's CUDA
	// runtime, for CUDA code), and why it failed when it does.
	embedded []embeddedModule
	// legacy is set for a library built by TVM 0.8-0.20, which dsoop loads
	// itself (legacy.c) rather than through TVM's loader.
	legacy *legacyABI
	// levels are the builds for higher x86-64 levels a portable library embeds
	// (levels.go); level is the one these bytes are, "" for other libraries.
	levels []level
	level  string
}

// Linux constants for memfd_create(2) and fcntl(2) seals.
const (
	mfdCloexec      = 0x1
	mfdAllowSealing = 0x2
	fAddSeals       = 1033
	sealAll         = 0x1 | 0x2 | 0x4 | 0x8 // F_SEAL_SEAL, SHRINK, GROW, WRITE
)

// sealAttempts is how many times sealMemfd asks for the seals. F_SEAL_WRITE
// waits for the file's pages that something else holds pinned for a moment
// (page migration or compaction under memory pressure: the kernel's
// memfd_wait_for_pins) and gives up with EBUSY after about 75 ms; a CI run
// loading forty model versions met it once.
const sealAttempts = 5

// addSeals adds every seal to the memfd fd (fcntl F_ADD_SEALS).
func addSeals(fd uintptr) syscall.Errno {
	_, _, errno := syscall.Syscall(syscall.SYS_FCNTL, fd, fAddSeals, sealAll)
	return errno
}

// sealMemfd seals fd with add, asking again after a pause while the kernel
// answers EBUSY, sealAttempts times in all.
func sealMemfd(fd uintptr, add func(uintptr) syscall.Errno) error {
	for attempt := 1; ; attempt++ {
		errno := add(fd)
		switch {
		case errno == 0:
			return nil
		case errno != syscall.EBUSY:
			return fmt.Errorf("sealing the copy: %w", errno)
		case attempt == sealAttempts:
			return fmt.Errorf("sealing the copy: %w (%d attempts)", errno, attempt)
		}
		time.Sleep(time.Duration(attempt) * 20 * time.Millisecond)
	}
}

// sealLibrary copies the file at path into a sealed memfd, hashing it on the
// way, and checks its ELF structure there.
func sealLibrary(path string) (*sealedLibrary, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	return seal(filepath.Base(path), src)
}

// seal copies a library's bytes from src into a sealed memfd named for name,
// hashing them on the way, and checks their ELF structure there, and that this
// CPU has the features the library records using.
func seal(name string, src io.Reader) (*sealedLibrary, error) {
	s, err := sealUnchecked(name, src)
	if err != nil {
		return nil, err
	}
	if err := checkCPUFlags(s.cpuFlags); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// sealUnchecked is seal without the CPU's check: for reading what a library
// says about itself (Inspect), a library this CPU cannot run included.
func sealUnchecked(name string, src io.Reader) (*sealedLibrary, error) {
	memfdName, err := syscall.BytePtrFromString("tvmdsoop:" + name)
	if err != nil {
		return nil, err
	}
	fd, _, errno := syscall.Syscall(sysMemfdCreate, uintptr(unsafe.Pointer(memfdName)), mfdCloexec|mfdAllowSealing, 0)
	if errno != 0 {
		return nil, fmt.Errorf("memfd_create: %w", errno)
	}
	mem := os.NewFile(fd, "memfd:"+name)
	h := sha256.New()
	size, err := io.Copy(io.MultiWriter(mem, h), src)
	if err == nil {
		err = sealMemfd(fd, addSeals)
	}
	if err != nil {
		mem.Close()
		return nil, err
	}
	s := &sealedLibrary{file: mem, size: size, digest: hex.EncodeToString(h.Sum(nil))}
	if err := s.check(); err != nil {
		mem.Close()
		return nil, err
	}
	return s, nil
}

// loaderFiles are the memfds whose paths the loader was given. The loader
// (glibc's dlopen) hands back a library already loaded from the path it is
// asked for, and libraries load from /proc/self/fd/N: a memfd closed while its
// library is still loaded would give its fd number, and so its path, to the
// next library, whose loads would run the old one's code. So a memfd its owner
// releases is closed only once the loader lists no library loaded from its
// path: at once when TVM's release of the module unloaded it, else at a later
// sweep (sweepLoaderFiles), once the Funcs, VMFuncs or C holders that kept it
// are gone. One the loader never unloads (glibc keeps a library that defines a
// GNU unique symbol, as C++ code may, until the process ends) keeps its memfd.
var loaderFiles struct {
	sync.Mutex
	given    map[*sealedLibrary]bool // owned by an entry or an Open in progress
	released []*sealedLibrary        // their owner is done; closed once unloaded
}

// loadPath is the path the loader opens: the memfd, by its /proc entry. From
// then on close leaves the memfd open until the loader has let go of the path.
func (s *sealedLibrary) loadPath() string {
	loaderFiles.Lock()
	defer loaderFiles.Unlock()
	if loaderFiles.given == nil {
		loaderFiles.given = map[*sealedLibrary]bool{}
	}
	loaderFiles.given[s] = true
	return s.procPath()
}

// procPath is the memfd's /proc entry, the name the loader knows the library by.
func (s *sealedLibrary) procPath() string { return fmt.Sprintf("/proc/self/fd/%d", s.file.Fd()) }

// close releases the memfd: at once when the loader was never given its path,
// else once the loader has unloaded the library (loaderFiles).
func (s *sealedLibrary) close() {
	loaderFiles.Lock()
	given := loaderFiles.given[s]
	if given {
		delete(loaderFiles.given, s)
		loaderFiles.released = append(loaderFiles.released, s)
	}
	loaderFiles.Unlock()
	if !given {
		s.file.Close()
		return
	}
	sweepLoaderFiles()
}

// sweepLoaderFiles closes the released memfds whose libraries the loader has
// unloaded. It runs where a library may just have been unloaded (the release
// of a Module, a Func, a VM pool, by Close or by a finaliser) and at each
// Open, which catches those whose last reference was dropped in C.
func sweepLoaderFiles() {
	loaderFiles.Lock()
	before := len(loaderFiles.released)
	loaderFiles.released = slices.DeleteFunc(loaderFiles.released, func(s *sealedLibrary) bool {
		cpath := C.CString(s.procPath())
		defer C.free(unsafe.Pointer(cpath))
		if C.dsoop_library_registered(cpath) != 0 {
			return false
		}
		s.file.Close()
		return true
	})
	unloaded := len(loaderFiles.released) < before
	loaderFiles.Unlock()
	if unloaded {
		// What the library's modules held (a model's weights, its VM's memory)
		// was freed with them: the heap keeps such large blocks otherwise, and
		// a server loading version after version would hold several versions'.
		// Out of the lock: the trim walks the whole heap.
		C.dsoop_trim_heap()
	}
}

// elfMachines is the ELF machine of each architecture Go builds this for.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// check refuses what the loader must not see (ErrNotALibrary), read with Go's
// ELF reader, which never runs anything, lists the __tvm_ffi_ symbols that are
// functions and those that are data, and reads which modules the library
// embeds and which CPU features it records using (seal checks those against
// this CPU's). The loader's own checks come after; a corrupted relocation or
// constructor passes these.
func (s *sealedLibrary) check() (err error) {
	defer func() {
		if r := recover(); r != nil { // a malformed file must not take the process down
			err = fmt.Errorf("%w: malformed ELF (%v)", ErrNotALibrary, r)
		}
	}()
	f, err := elf.NewFile(io.NewSectionReader(s.file, 0, s.size))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNotALibrary, err)
	}
	if f.Class != elf.ELFCLASS64 || f.Type != elf.ET_DYN {
		return fmt.Errorf("%w: an ELF %s %s, not a 64-bit shared object", ErrNotALibrary, f.Class, f.Type)
	}
	if want, ok := elfMachines[runtime.GOARCH]; ok && f.Machine != want {
		return fmt.Errorf("%w: built for %s, this process runs on %s", ErrNotALibrary, f.Machine, want)
	}
	for i, p := range f.Progs {
		if p.Off > uint64(s.size) || p.Filesz > uint64(s.size)-p.Off {
			return fmt.Errorf("%w: program header %d points past the end of the file", ErrNotALibrary, i)
		}
	}
	if len(f.Progs) == 0 {
		return fmt.Errorf("%w: no program headers", ErrNotALibrary)
	}
	symbols, err := f.DynamicSymbols()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return fmt.Errorf("%w: dynamic symbols: %v", ErrNotALibrary, err)
	}
	for _, sym := range symbols {
		if err := checkLoaderSlot(f.Progs, sym); err != nil {
			return fmt.Errorf("%w: %v", ErrNotALibrary, err)
		}
		if isContextPointer(sym) {
			s.contextPointers = append(s.contextPointers, sym.Name)
		}
		name, ok := strings.CutPrefix(sym.Name, ffiSymbolPrefix)
		if !ok || sym.Section == elf.SHN_UNDEF {
			continue
		}
		if isCode(sym) {
			if !isReservedName(name) {
				s.functions = append(s.functions, name)
			}
		} else {
			if s.notCode == nil {
				s.notCode = map[string]bool{}
			}
			s.notCode[name] = true
		}
	}
	// TVM's loader reads the serialized modules as they are, and some of its
	// readers crash on bytes that are not what they expect: refuse what
	// readEmbeddedModules cannot read or verify.
	if s.embedded, err = readEmbeddedModules(f, symbols); err != nil {
		return fmt.Errorf("%w: %v", ErrNotALibrary, err)
	}
	s.legacy = readLegacyABI(symbols)
	if s.levels, err = readLevels(symbols, f); err != nil {
		return fmt.Errorf("%w: %v", ErrNotALibrary, err)
	}
	if s.cpuFlags, err = readCPUFlags(f, symbols); err != nil {
		return fmt.Errorf("%w: %v", ErrNotALibrary, err)
	}
	slices.Sort(s.functions)
	s.functions = slices.Compact(s.functions)
	return nil
}

// isCode reports whether sym is a function (or an ifunc, which resolves to one).
func isCode(sym elf.Symbol) bool {
	t := elf.ST_TYPE(sym.Info)
	return t == elf.STT_FUNC || t == elf.STT_GNU_IFUNC
}

// isContextPointer reports whether sym is a pointer the library defines and
// calls through, filled at load with a function of the runtime's:
// __TVMBackendParallelLaunch, __TVMBackendAllocWorkspace, __TVMAPISetLastError,
// ... (TVM's code generators name each "__" and the function's name).
func isContextPointer(sym elf.Symbol) bool {
	return sym.Section != elf.SHN_UNDEF && !isCode(sym) && strings.HasPrefix(sym.Name, "__TVM")
}

// libraryCtxSymbol is where TVM's loader writes the library's module (tvm-ffi's
// symbol::tvm_ffi_library_ctx).
const libraryCtxSymbol = ffiSymbolPrefix + "_library_ctx"

// checkLoaderSlot refuses sym when a loader would write a pointer into it and
// it is not 8 bytes of the library's writable memory: TVM's loader fills every
// __TVM... symbol whose name TVM's runtime registered and the module context,
// dsoop_legacy_open the context symbols of older libraries. A slot in code or
// constants, at an absolute address, or in what the dynamic loader makes
// read-only after relocation (RELRO) would fault in that write, or in the
// read that checks it.
func checkLoaderSlot(progs []*elf.Prog, sym elf.Symbol) error {
	if sym.Section == elf.SHN_UNDEF ||
		!(strings.HasPrefix(sym.Name, "__TVM") || sym.Name == libraryCtxSymbol || sym.Name == "__tvm_module_ctx") {
		return nil
	}
	const size = 8 // a pointer
	start, end := sym.Value, sym.Value+size
	inside := func(p *elf.Prog) bool {
		return p.Memsz <= math.MaxUint64-p.Vaddr && start >= p.Vaddr && end <= p.Vaddr+p.Memsz
	}
	writable := false
	for _, p := range progs {
		switch {
		case p.Type == elf.PT_GNU_RELRO && start < p.Vaddr+p.Memsz && end > p.Vaddr:
			return fmt.Errorf("its symbol %s, which the loader writes a pointer into, is in memory made read-only "+
				"after relocation (RELRO)", sym.Name)
		case p.Type == elf.PT_LOAD && p.Flags&(elf.PF_R|elf.PF_W) == elf.PF_R|elf.PF_W && inside(p):
			writable = true
		}
	}
	if sym.Section >= elf.SHN_LORESERVE || end < start || !writable {
		return fmt.Errorf("its symbol %s, which the loader writes a pointer into, is not %d bytes of its writable "+
			"memory", sym.Name, size)
	}
	return nil
}

// vmFunctionTable is the VM functions of the Relax VM executable the library
// embeds, as its function table lists them; nil when it embeds none.
func (s *sealedLibrary) vmFunctionTable() []string {
	exec, _ := s.embeds(vmExecutableKind)
	return exec.vmFunctions
}

// embeds returns the library's embedded module of that kind, if it has one.
func (s *sealedLibrary) embeds(kind string) (embeddedModule, bool) {
	for _, m := range s.embedded {
		if m.kind == kind {
			return m, true
		}
	}
	return embeddedModule{}, false
}
