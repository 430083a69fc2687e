package dsoop

import (
	"fmt"
	"slices"
)

// VMFunctions lists the functions of the model, sorted: its entry points (main,
// forward, ...), from the executable's function table as the library carries
// it (readVMExecutable verified it before the library was loaded).
func (m *Module) VMFunctions() ([]string, error) {
	if m.entry.graph != nil {
		return []string{m.entry.graph.name}, nil // a graph executor model has one
	}
	if !m.entry.isVM {
		return nil, fmt.Errorf("dsoop: library %s holds no Relax VM executable", m.entry.path)
	}
	return slices.Sorted(slices.Values(m.entry.sealed.vmFunctionTable())), nil
}
