package dsoop

/*
#include <stdlib.h>
#include "legacy_graph.h"
#include "vm.h"
*/
import "C"

import (
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

// readLegacyBlobOf reads the sealed library's __tvm_dev_mblob (see
// readLegacyBlob): nil when it has none.
func readLegacyBlobOf(s *sealedLibrary) (_ *legacyBlob, err error) {
	defer func() {
		if r := recover(); r != nil { // debug/elf on a malformed file must not take the process down
			err = fmt.Errorf("%w: malformed ELF (%v)", ErrNotALibrary, r)
		}
	}()
	if !s.legacy.devBlob {
		return nil, nil
	}
	f, err := elf.NewFile(io.NewSectionReader(s.file, 0, s.size))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotALibrary, err)
	}
	symbols, err := f.DynamicSymbols()
	if err != nil {
		return nil, fmt.Errorf("%w: dynamic symbols: %v", ErrNotALibrary, err)
	}
	for _, sym := range symbols {
		if sym.Name != legacyDevBlobSymbol || sym.Section == elf.SHN_UNDEF {
			continue
		}
		data, err := symbolData(f, sym)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrNotALibrary, err)
		}
		return readLegacyBlob(data, uint64(data.Size()))
	}
	return nil, nil
}

// graphPlan is a verified graph with its params, ready for the executor: which
// graph inputs the model takes, which storage holds params only.
type graphPlan struct {
	graph  *legacyGraph
	inputs []graphInput        // the model's inputs: the graph's inputs that are not params, in graph order
	params map[int]legacyParam // by entry
	shared []bool              // per storage: holds params only
}

// planGraph binds params to the graph's inputs by name (params the graph does
// not take are left out, as TVM's load_params does), and checks that every
// kernel is a function the library exports.
func planGraph(g *legacyGraph, params []legacyParam, functions map[string]bool) (*graphPlan, error) {
	for _, op := range g.ops {
		if op.fn != "" && !functions[op.fn] {
			return nil, fmt.Errorf("graph node %q calls %s, which the library does not export", op.name, op.fn)
		}
	}
	byName := map[string]legacyParam{}
	for _, p := range params {
		byName[p.name] = p
	}
	plan := &graphPlan{graph: g, params: map[int]legacyParam{}, shared: make([]bool, len(g.storage))}
	names := map[string]bool{}
	for _, in := range g.inputs {
		if names[in.name] {
			return nil, fmt.Errorf("graph: two inputs named %q", in.name)
		}
		names[in.name] = true
		p, ok := byName[in.name]
		if !ok {
			plan.inputs = append(plan.inputs, in)
			continue
		}
		e := g.entries[in.entry]
		if dtype := paramDType(p.dtype); dtype != e.dtype || !equalShapes(p.shape, e.shape) {
			return nil, fmt.Errorf("params: %q is a %v tensor of shape %v; the graph takes %v of shape %v",
				p.name, p.dtype, p.shape, e.dtype, e.shape)
		}
		plan.params[in.entry] = p
	}
	// A storage that holds params only is filled once and shared by every
	// instance; one that a kernel writes too (which TVM's planner never makes)
	// gets the param copied into each instance's.
	for s := range plan.shared {
		plan.shared[s] = true
	}
	for i, e := range g.entries {
		if _, isParam := plan.params[i]; !isParam {
			plan.shared[e.storage] = false
		}
	}
	return plan, nil
}

// paramDType is a param's dtype as the graph writes it: bool as uint1.
func paramDType(t dlpack.DataType) dlpack.DataType {
	if t.Code == dlpack.Bool && t.Bits == 8 && t.Lanes == 1 {
		return dlpack.DataType{Code: dlpack.UInt, Bits: 1, Lanes: 1}
	}
	return t
}

func equalShapes(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// cArray copies s into C memory, which the caller frees.
func cArray[T any](s []T) *T {
	var zero T
	p := (*T)(C.calloc(C.size_t(max(len(s), 1)), C.size_t(unsafe.Sizeof(zero))))
	copy(unsafe.Slice(p, len(s)), s)
	return p
}

// newCGraph makes the C executor of plan over lib's functions, named name,
// with the params in it.
func newCGraph(lib *C.DsoopLegacyLibrary, name string, plan *graphPlan) (*C.DsoopGraph, error) {
	g := plan.graph
	var frees []unsafe.Pointer
	defer func() {
		for _, p := range frees {
			C.free(p)
		}
	}()
	keep := func(p unsafe.Pointer) unsafe.Pointer { frees = append(frees, p); return p }
	cstr := func(s string) *C.char { return (*C.char)(keep(unsafe.Pointer(C.CString(s)))) }

	shared := make([]C.uint8_t, len(g.storage))
	for s, ok := range plan.shared {
		if ok {
			shared[s] = 1
		}
	}
	storage := make([]C.int64_t, len(g.storage))
	for s, n := range g.storage {
		storage[s] = C.int64_t(n)
	}
	var entryStorage, entryNDim []C.int32_t
	var entryDType []C.DLDataType
	var shapes []C.int64_t
	for _, e := range g.entries {
		entryStorage = append(entryStorage, C.int32_t(e.storage))
		entryNDim = append(entryNDim, C.int32_t(len(e.shape)))
		entryDType = append(entryDType, C.DLDataType{code: C.uint8_t(e.dtype.Code), bits: C.uint8_t(e.dtype.Bits), lanes: C.uint16_t(e.dtype.Lanes)})
		for _, d := range e.shape {
			shapes = append(shapes, C.int64_t(d))
		}
	}
	var opFunc []*C.char
	var opNumArgs, opArgs []C.int32_t
	var opFlatten []C.uint8_t
	for _, op := range g.ops {
		opFunc = append(opFunc, cstr(op.fn))
		opNumArgs = append(opNumArgs, C.int32_t(len(op.args)))
		for _, a := range op.args {
			opArgs = append(opArgs, C.int32_t(a))
		}
		flatten := C.uint8_t(0)
		if op.flatten {
			flatten = 1
		}
		opFlatten = append(opFlatten, flatten)
	}
	var inputEntry, outputEntry []C.int32_t
	var inputName []*C.char
	for _, in := range plan.inputs {
		inputEntry = append(inputEntry, C.int32_t(in.entry))
		inputName = append(inputName, cstr(in.name))
	}
	for _, e := range g.outputs {
		outputEntry = append(outputEntry, C.int32_t(e))
	}
	spec := C.DsoopGraphSpec{
		num_storage:    C.int32_t(len(g.storage)),
		storage_bytes:  (*C.int64_t)(keep(unsafe.Pointer(cArray(storage)))),
		storage_shared: (*C.uint8_t)(keep(unsafe.Pointer(cArray(shared)))),
		num_entries:    C.int32_t(len(g.entries)),
		entry_storage:  (*C.int32_t)(keep(unsafe.Pointer(cArray(entryStorage)))),
		entry_dtype:    (*C.DLDataType)(keep(unsafe.Pointer(cArray(entryDType)))),
		entry_ndim:     (*C.int32_t)(keep(unsafe.Pointer(cArray(entryNDim)))),
		entry_shape:    (*C.int64_t)(keep(unsafe.Pointer(cArray(shapes)))),
		num_ops:        C.int32_t(len(g.ops)),
		op_func:        (**C.char)(keep(unsafe.Pointer(cArray(opFunc)))),
		op_num_args:    (*C.int32_t)(keep(unsafe.Pointer(cArray(opNumArgs)))),
		op_args:        (*C.int32_t)(keep(unsafe.Pointer(cArray(opArgs)))),
		op_flatten:     (*C.uint8_t)(keep(unsafe.Pointer(cArray(opFlatten)))),
		num_inputs:     C.int32_t(len(plan.inputs)),
		input_entry:    (*C.int32_t)(keep(unsafe.Pointer(cArray(inputEntry)))),
		input_name:     (**C.char)(keep(unsafe.Pointer(cArray(inputName)))),
		num_outputs:    C.int32_t(len(g.outputs)),
		output_entry:   (*C.int32_t)(keep(unsafe.Pointer(cArray(outputEntry)))),
	}
	var cg *C.DsoopGraph
	var cerr C.DsoopError
	if C.dsoop_graph_create(lib, cstr(name), &spec, &cg, &cerr) != 0 {
		return nil, takeError(&cerr)
	}
	for entry, p := range plan.params {
		var data unsafe.Pointer
		if len(p.data) > 0 {
			data = unsafe.Pointer(&p.data[0])
		}
		if C.dsoop_graph_set_param(cg, C.int32_t(entry), data, C.int64_t(len(p.data)), &cerr) != 0 {
			C.dsoop_graph_destroy(cg)
			return nil, takeError(&cerr)
		}
	}
	return cg, nil
}

// graphModel is a relay.build model of a module: its executor, until the
// module's pool takes it over (poolFor), and its one function's name.
type graphModel struct {
	name   string
	cgraph *C.DsoopGraph // guarded by poolsMu; nil once a pool holds it
}

func (gm *graphModel) close() {
	if gm != nil && gm.cgraph != nil {
		C.dsoop_graph_destroy(gm.cgraph)
		gm.cgraph = nil
	}
}

// planGraphJSON reads and verifies a graph and its params against the
// functions of its library.
func planGraphJSON(graphJSON []byte, params []legacyParam, abi *legacyABI) (*graphPlan, error) {
	g, err := readGraphJSON(graphJSON)
	if err != nil {
		return nil, err
	}
	return planGraph(g, params, abi.functions)
}

// openLegacyModel loads a library of TVM 0.8-0.20 (openLegacy) and, when it
// embeds a graph executor factory (relay.build's one-file model), makes the
// model's executor. The factory's graph and params are verified before the
// library is loaded.
func openLegacyModel(s *sealedLibrary, path string) (*C.DsoopLegacyLibrary, *graphModel, error) {
	blob, err := readLegacyBlobOf(s)
	if err != nil {
		return nil, nil, err
	}
	var plan *graphPlan
	if blob != nil && blob.factory {
		if plan, err = planGraphJSON(blob.graphJSON, blob.params, s.legacy); err != nil {
			return nil, nil, fmt.Errorf("its graph executor factory: %w", err)
		}
	}
	lib, err := openLegacy(s, path)
	if err != nil || plan == nil {
		return lib, nil, err
	}
	cg, err := newCGraph(lib, blob.name, plan)
	if err != nil {
		C.dsoop_legacy_release(lib)
		return nil, nil, err
	}
	return lib, &graphModel{name: blob.name, cgraph: cg}, nil
}

// graphPool makes the pool of instances of the module's graph, on the CPU
// only; poolsMu is held.
func (m *Module) graphPool(device dlpack.Device, instances int) (*vmPool, error) {
	gm := m.entry.graph
	if device.Type != dlpack.CPU {
		return nil, fmt.Errorf("dsoop: library %s: %w: a relay.build model runs on the CPU, not %v", m.entry.path, ErrLegacyUnsupported, device)
	}
	if gm.cgraph == nil {
		return nil, fmt.Errorf("dsoop: library %s: its graph executor failed to start before", m.entry.path)
	}
	var ptr *C.DsoopVMPool
	var cerr C.DsoopError
	rc := C.dsoop_vm_pool_create_graph(gm.cgraph, C.int32_t(instances), &ptr, &cerr)
	gm.cgraph = nil // taken over, and freed on failure
	if rc != 0 {
		return nil, fmt.Errorf("dsoop: library %s: cannot start the model's graph executor: %w", m.entry.path, takeError(&cerr))
	}
	return &vmPool{ptr: ptr, refs: 2}, nil
}

// Graph runs a relay.build model given as three files: this module is its
// library (lib.export_library of TVM 0.8-0.20), graphJSON the graph
// (get_graph_json) and params relay.save_param_dict's blob. Both are verified
// before anything runs. The Module returned is a whole model (IsModel) of one
// function, "default", whose inputs are the graph's inputs that are not params;
// close it as any Module, apart from this one.
func (m *Module) Graph(graphJSON, params []byte) (*Module, error) {
	m.ref.mu.RLock()
	defer m.ref.mu.RUnlock()
	if m.ref.closed {
		return nil, fmt.Errorf("dsoop: library %s: %w", m.entry.path, ErrClosed)
	}
	e := m.entry
	if e.legacy == nil {
		return nil, fmt.Errorf("dsoop: library %s: %w: a graph executor model's library is one of TVM 0.8-0.20", e.path, ErrLegacyUnsupported)
	}
	if e.graph != nil {
		return nil, fmt.Errorf("dsoop: library %s holds its own graph already", e.path)
	}
	ps, err := readParamBlob(params)
	if err != nil {
		return nil, fmt.Errorf("dsoop: library %s: %w", e.path, err)
	}
	plan, err := planGraphJSON(graphJSON, ps, e.sealed.legacy)
	if err != nil {
		return nil, fmt.Errorf("dsoop: library %s: %w", e.path, err)
	}
	cg, err := newCGraph(e.legacy, legacyGraphName, plan)
	if err != nil {
		return nil, fmt.Errorf("dsoop: library %s: %w", e.path, err)
	}
	gm := &graphModel{name: legacyGraphName, cgraph: cg}
	// An entry of its own, not among the loaded libraries: the model is this
	// graph over the library, which it keeps loaded.
	C.dsoop_legacy_retain(e.legacy)
	return newModule(&moduleEntry{path: e.path, stat: e.stat, sealed: e.sealed, legacy: e.legacy, graph: gm, opens: 1}), nil
}

// GraphFiles is Graph with the graph JSON and the params read from their
// files, as Open reads a library: each must lie in the allowed folders
// (AllowedDirsEnv) and, when a digest is given, have that SHA-256 (hex), checked
// on the bytes read.
func (m *Module) GraphFiles(graphPath, graphSHA256, paramsPath, paramsSHA256 string) (*Module, error) {
	graph, err := readPinnedFile(graphPath, graphSHA256, maxGraphJSONBytes)
	if err != nil {
		return nil, err
	}
	params, err := readPinnedFile(paramsPath, paramsSHA256, maxTensorBytes)
	if err != nil {
		return nil, err
	}
	return m.Graph(graph, params)
}

// readPinnedFile reads a file of a model (at most limit bytes) from the
// allowed folders, and checks its digest when want is not "".
func readPinnedFile(path, want string, limit int64) ([]byte, error) {
	if strings.ContainsRune(path, 0) {
		return nil, fmt.Errorf("dsoop: path %q holds a NUL byte", path)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("dsoop: %q: %w", path, err)
	}
	if err := checkAllowed(abs, getenv(AllowedDirsEnv)); err != nil {
		return nil, err
	}
	f, err := os.Open(abs)
	if err != nil {
		return nil, fmt.Errorf("dsoop: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("dsoop: %s: %w", abs, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("dsoop: %s: more than %d bytes", abs, limit)
	}
	sum := sha256.Sum256(data)
	if digest := hex.EncodeToString(sum[:]); want != "" && !strings.EqualFold(digest, want) {
		return nil, fmt.Errorf("%w: %s has SHA-256 %s, the model expects %s", ErrDigestMismatch, abs, digest, want)
	}
	return data, nil
}

// legacyGraphName is the function of a three-file model, as relay.build names
// the one-file model's (its factory's module name).
const legacyGraphName = "default"

// IsModel reports whether the module is a whole model, called through VMFunc:
// a Relax VM executable (IsVM), or a graph executor model of relay.build
// (TVM 0.8-0.20: a library with its factory embedded, or Graph's).
func (m *Module) IsModel() bool { return m.entry.isVM || m.entry.graph != nil }
