package dsoop

import (
	"encoding/binary"
	"fmt"
	"regexp"
	"slices"
)

// VMFunctions lists the functions of the model, sorted (its entry points: main,
// forward, ...), for messages: from the executable's function table as the
// library carries it, else from TVM's text form of the executable.
func (m *Module) VMFunctions() ([]string, error) {
	if !m.entry.isVM {
		return nil, fmt.Errorf("dsoop: library %s holds no Relax VM executable", m.entry.path)
	}
	if table := m.entry.sealed.vmFunctionTable(); table != nil {
		return slices.Sorted(slices.Values(table)), nil
	}
	return m.vmFunctionsFromText()
}

// vmExecutableKind is the kind of a Relax VM executable's module.
const vmExecutableKind = "relax.VMExecutable"

// The start of a Relax VM executable's bytes, as apache-tvm 0.27 writes them
// (src/runtime/vm/executable.cc, SaveToBytes): a magic number (its second
// version also saves memory scopes, after the table), the VM's version, then
// the function table.
var vmExecutableMagics = map[uint64]bool{0xD225DE2F4214151D: true, 0xD225DE2F4214151E: true}

const (
	vmExecutableVersion = "0.14"
	vmFuncKindVM        = 1 // VMFuncInfo::FuncKind::kVMFunc; 0 and 2 are kernels and builtins
	maxVMFunctions      = 1 << 20
)

// readVMFunctions reads the names of a VM executable's VM functions (its entry
// points: main, forward, ...) from its function table (see readVMTable).
func readVMFunctions(r *binReader) ([]string, error) {
	table, err := readVMTable(r)
	var names []string
	for _, f := range table {
		names = append(names, f.name)
	}
	return names, err
}

// vmFunction is a VM function of an executable's table: its name and its
// parameters' names.
type vmFunction struct {
	name   string
	params []string
}

// readVMTable reads a VM executable's VM functions from its function table,
// which the executable's bytes begin with: a u64 count, then per function an
// i32 kind, a str name, four i64 (first and last instruction, arguments,
// registers) and a vec of str parameter names. Only the table is read, never
// the instructions: for a corrupted executable, TVM's as_text, which decodes
// them, can crash.
func readVMTable(r *binReader) ([]vmFunction, error) {
	if magic := r.u64(); r.err == nil && !vmExecutableMagics[magic] {
		return nil, fmt.Errorf("not a Relax VM executable of this TVM (magic %#x)", magic)
	}
	if version := r.str(); r.err == nil && version != vmExecutableVersion {
		return nil, fmt.Errorf("a Relax VM executable of version %q, not %s", version, vmExecutableVersion)
	}
	count := r.u64()
	if r.err == nil && count > maxVMFunctions {
		return nil, fmt.Errorf("a function table of %d entries", count)
	}
	var table []vmFunction
	for i := uint64(0); r.err == nil && i < count; i++ {
		kind := r.read(4)
		f := vmFunction{name: r.str()}
		r.skipWords(4)
		for p := r.u64(); r.err == nil && p > 0; p-- {
			f.params = append(f.params, r.str())
		}
		if r.err == nil && binary.LittleEndian.Uint32(kind) == vmFuncKindVM {
			table = append(table, f)
		}
	}
	return table, r.err
}

// vmFunctionHeader finds the VM functions in the executable's text form: each
// begins with "@name:" alone on a line (kernels and builtins end with
// "packed_func;").
var vmFunctionHeader = regexp.MustCompile(`(?m)^@(\S+):$`)

// vmFunctionsFromText lists the model's functions from TVM's text form of the
// executable, which decodes every instruction.
func (m *Module) vmFunctionsFromText() ([]string, error) {
	asText, err := m.Func("as_text")
	if err != nil {
		return nil, err
	}
	defer asText.Close()
	text, err := asText.CallValue()
	if err != nil {
		return nil, err
	}
	s, _ := text.(string)
	var names []string
	for _, match := range vmFunctionHeader.FindAllStringSubmatch(s, -1) {
		names = append(names, match[1])
	}
	slices.Sort(names)
	return names, nil
}
