package dsoop

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The kinds of library, as Inspection.Kind names them.
const (
	KindFunctions = "functions" // functions exported to TVM-FFI (__tvm_ffi_<name>): tvm.compile of TIR, tvm-ffi C++
	KindModel     = "model"     // a whole model: a Relax VM executable or relay.build graph, whose functions return their outputs
	KindLegacy    = "legacy"    // a library of TVM 0.8-0.21, exporting functions under their own names
)

// Inspection is what a library's file says about itself, read with Go's ELF
// reader and nothing of it run: for tools that show a library before anyone
// trusts it (tvmdsoop inspect), and messages.
type Inspection struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	// Kind is KindFunctions, KindModel or KindLegacy.
	Kind string `json:"kind"`
	// TVM is which TVMs make libraries of this form: "0.8-0.20", "0.21", or
	// ">=0.22" for the TVM-FFI calling convention (which libraries of tvm-ffi
	// alone share). Libraries carry no finer record of their TVM's version.
	TVM string `json:"tvm"`
	// Functions are the functions a caller names: a model's entry points (its
	// VM functions), or the library's exported functions, sorted.
	Functions []string `json:"functions"`
	// Parameters are the parameters' names of a model's functions, as its
	// function table records them; none for other libraries, whose signatures
	// are known only to code of theirs (TVM-FFI's metadata getters).
	Parameters map[string][]string `json:"parameters,omitempty"`
	// CPUFlags are the CPU features the library records using (tf_op.compile's
	// libraries), as /proc/cpuinfo names them; MissingCPUFlags those of them
	// this CPU lacks: the op would refuse the library here.
	CPUFlags        []string `json:"cpu_flags,omitempty"`
	MissingCPUFlags []string `json:"missing_cpu_flags,omitempty"`
	// Levels are the builds for higher x86-64 levels a portable library
	// embeds, with the CPU flags each uses.
	Levels []InspectedLevel `json:"levels,omitempty"`
	// Embedded are the modules the library carries for TVM's loader to
	// rebuild: a Relax VM executable, CUDA code, ...
	Embedded []InspectedModule `json:"embedded,omitempty"`
}

// InspectedLevel is one x86-64 level a portable library embeds.
type InspectedLevel struct {
	Name     string   `json:"name"`
	CPUFlags []string `json:"cpu_flags"`
}

// InspectedModule is one module a library embeds: its kind ("cuda",
// "relax.VMExecutable", ...) and, for CUDA code, its format ("ptx", "cubin",
// "fatbin", or "cuda" for C++ source).
type InspectedModule struct {
	Kind   string `json:"kind"`
	Format string `json:"format,omitempty"`
}

// Inspect reads what the library at path says about itself without loading
// it: nothing of the file runs, and it is not checked against this CPU (a
// library compiled for another CPU is described, its missing flags named). A
// file that is not a shared library this process could load is
// ErrNotALibrary, as Open would find it; a missing one fs.ErrNotExist.
func Inspect(path string) (*Inspection, error) {
	if strings.ContainsRune(path, 0) {
		return nil, fmt.Errorf("dsoop: library path %q holds a NUL byte", path)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("dsoop: library %q: %w", path, err)
	}
	if _, err := statLibrary(abs); err != nil {
		return nil, err
	}
	src, err := os.Open(abs)
	if err != nil {
		return nil, fmt.Errorf("dsoop: library %s: %w", abs, err)
	}
	defer src.Close()
	s, err := sealUnchecked(filepath.Base(abs), src)
	if err != nil {
		return nil, fmt.Errorf("dsoop: library %s: %w", abs, err)
	}
	defer s.close()
	in := &Inspection{Path: abs, SHA256: s.digest, Size: s.size, Kind: KindFunctions, TVM: ">=0.22",
		Functions: s.functions, CPUFlags: s.cpuFlags}
	if host := hostCPUFlags(); host != nil {
		in.MissingCPUFlags = missingFlags(s.cpuFlags, host)
	}
	for _, l := range s.levels {
		in.Levels = append(in.Levels, InspectedLevel{Name: l.name, CPUFlags: l.flags})
	}
	for _, m := range s.embedded {
		in.Embedded = append(in.Embedded, InspectedModule{Kind: m.kind, Format: m.format})
	}
	switch exec, isVM := s.embeds(vmExecutableKind); {
	case s.legacy != nil:
		in.Kind, in.TVM, in.Functions = KindLegacy, "0.8-0.20", s.legacyFunctions()
		if s.legacy.tvm021 {
			in.TVM = "0.21"
		}
		// relay.build's one-file model: its factory's one function. A blob that
		// does not read is the load's to report.
		if blob, err := readLegacyBlobOf(s); err == nil && blob != nil && blob.factory {
			in.Kind, in.Functions = KindModel, []string{blob.name}
			in.Embedded = append(in.Embedded, InspectedModule{Kind: graphFactoryKind})
		}
	case isVM:
		in.Kind, in.Functions, in.Parameters = KindModel, slices.Sorted(slices.Values(exec.vmFunctions)), exec.vmParams
	}
	if in.Functions == nil {
		in.Functions = []string{} // a list, empty, for JSON readers
	}
	return in, nil
}

// legacyFunctions are the functions a library of TVM 0.8-0.21 exports, sorted.
func (s *sealedLibrary) legacyFunctions() []string {
	return slices.Sorted(maps.Keys(s.legacy.functions))
}

// Functions lists the functions of the module a caller may name, sorted: a
// model's VM functions (VMFunctions), else those the library exports, as its
// symbols say (TVM's names for its own symbols left out).
func (m *Module) Functions() ([]string, error) {
	switch {
	case m.entry.isVM, m.entry.graph != nil:
		return m.VMFunctions()
	case m.entry.legacy != nil:
		return m.entry.sealed.legacyFunctions(), nil
	default:
		return slices.Clone(m.entry.sealed.functions), nil
	}
}
