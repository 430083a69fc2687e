package dsoop

import (
	"fmt"
	"regexp"
	"slices"
	"syscall"
)

// What the tests of package dsoop_test, which build the test libraries, look at
// inside.

// SharesLoad reports whether two Modules are opens of one loaded library.
func SharesLoad(a, b *Module) bool { return a.entry == b.entry }

// Loaded reports whether a library loaded from path (absolute) is open.
func Loaded(path string) bool {
	modulesMu.Lock()
	defer modulesMu.Unlock()
	_, ok := modules[path]
	return ok
}

// LockPath takes the lock that an Open of path holds while it loads the library.
func LockPath(path string) (unlock func()) { return lockPath(path) }

// EmbeddedModules lists the modules the library at path embeds for TVM's
// loader: their kinds, and for CUDA code its format after a colon.
func EmbeddedModules(path string) ([]string, error) {
	s, err := sealLibrary(path)
	if err != nil {
		return nil, err
	}
	defer s.close()
	var modules []string
	for _, m := range s.embedded {
		if m.format != "" {
			modules = append(modules, fmt.Sprintf("%s:%s", m.kind, m.format))
		} else {
			modules = append(modules, m.kind)
		}
	}
	return modules, nil
}

// SameObject reports whether two Funcs call through one TVM function object.
func SameObject(a, b *Func) bool { return a.ref.fn.handle == b.ref.fn.handle }

// CallsSymbol reports whether f calls its library's exported symbol directly,
// not through its function object.
func CallsSymbol(f *Func) bool { return f.ref.fn.self == nil }

// VMFunctionTables gives the functions a model's executable lists in its function
// table, as the library carries it, and those of TVM's text form of the
// executable, which decodes every instruction: each "@name:" alone on a line,
// or "@name num_inputs=N vm_tir_func;" for one compiled to native code (kernels
// and builtins end with "packed_func;").
func VMFunctionTables(m *Module) (table, text []string, err error) {
	asText, err := m.Func("as_text")
	if err != nil {
		return nil, nil, err
	}
	defer asText.Close()
	form, err := asText.CallValue()
	if err != nil {
		return nil, nil, err
	}
	s, _ := form.(string)
	for _, match := range regexp.MustCompile(`(?m)^@(\S+)(?::| num_inputs=\d+ vm_tir_func;)$`).FindAllStringSubmatch(s, -1) {
		text = append(text, match[1])
	}
	slices.Sort(text)
	return m.entry.sealed.vmFunctionTable(), text, nil
}

// LoaderFile is the memfd m's library was loaded from: the path the loader
// knows it by, and the memfd's inode.
func LoaderFile(m *Module) (path string, inode uint64) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(m.entry.sealed.file.Fd()), &st); err != nil {
		panic(err) // open while m is: its entry's memfd is released only when its Modules are closed
	}
	return m.entry.sealed.procPath(), st.Ino
}
