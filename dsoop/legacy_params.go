package dsoop

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

// tvmNDArrayListMagic begins a param blob (src/runtime/file_utils.h); each of
// its tensors begins with tensorMagic.
const tvmNDArrayListMagic = 0xF7E58D4F05049CB7

// graphFactoryKind is the type key of the module relay.build's export_library
// embeds for a one-file model: the graph, its params and the model's name.
const graphFactoryKind = "GraphExecutorFactory"

// Bounds on params, as on graphs: a corrupted blob must fail, not allocate.
const maxParams = 1 << 20

// legacyParam is a tensor of a param blob; data is a slice of the blob.
type legacyParam struct {
	name  string
	dtype dlpack.DataType
	shape []int64
	data  []byte
}

// readParamBlob reads relay.save_param_dict's blob (file_utils.cc, SaveParams):
//
//	<list magic: u64> <reserved: u64> <names: vec<str>> <count: u64> then count tensors
//
// each as SaveDLTensor writes it (see readParamTensor).
func readParamBlob(blob []byte) ([]legacyParam, error) {
	r := &binReader{r: bytes.NewReader(blob), limit: uint64(len(blob))}
	if magic := r.u64(); r.err == nil && magic != tvmNDArrayListMagic {
		return nil, errors.New("params: not a TVM param blob (no list magic)")
	}
	r.u64() // reserved
	names := readNames(r, r.u64())
	params := readNamedParams(r, names, r.u64())
	if r.err == nil && r.left() != 0 {
		r.err = fmt.Errorf("%d bytes past the last tensor", r.left())
	}
	if r.err != nil {
		return nil, fmt.Errorf("params: %w", r.err)
	}
	return params, nil
}

// readNamedParams reads count tensors, which must be one for each of names.
func readNamedParams(r *binReader, names []string, count uint64) []legacyParam {
	if r.err == nil && count != uint64(len(names)) {
		r.err = fmt.Errorf("%d names for %d tensors", len(names), count)
	}
	seen := map[string]bool{}
	var params []legacyParam
	for _, name := range names {
		if r.err == nil && seen[name] {
			r.err = fmt.Errorf("the param %q twice", name)
		}
		seen[name] = true
		p := readParamTensor(r)
		p.name = name
		params = append(params, p)
	}
	if r.err != nil {
		return nil
	}
	return params
}

func readNames(r *binReader, n uint64) []string {
	if r.err == nil && (n > maxParams || n > r.left()/8) {
		r.err = fmt.Errorf("%d names", n)
	}
	var names []string
	for i := uint64(0); r.err == nil && i < n; i++ {
		names = append(names, r.strMax(4096))
	}
	return names
}

// readParamTensor reads a tensor as SaveDLTensor writes it (readSavedTensor);
// its data is a slice of what r reads.
func readParamTensor(r *binReader) legacyParam {
	t := readSavedTensor(r)
	p := legacyParam{dtype: t.dtype, shape: t.shape}
	if r.err != nil {
		return p
	}
	// SaveDLTensor always writes the CPU: what it saves was copied there.
	if t.deviceType != int32(dlpack.CPU) {
		r.err = fmt.Errorf("a tensor of device type %d", t.deviceType)
		return p
	}
	want, err := tensorBytes(p.dtype, p.shape)
	if err != nil {
		r.err = err
	} else if t.nbytes != want {
		r.err = fmt.Errorf("a %v tensor of shape %v with %d bytes of data", p.dtype, p.shape, t.nbytes)
	}
	p.data = r.read(uint64(t.nbytes))
	return p
}

// legacyBlob is what a library of TVM <= 0.20 embeds (__tvm_dev_mblob) that
// dsoop runs: a graph executor factory's graph, params and name, when it has one.
type legacyBlob struct {
	factory   bool
	name      string
	graphJSON []byte
	params    []legacyParam
}

// readLegacyBlob reads the modules of __tvm_dev_mblob, as TVM 0.18's
// ProcessModuleBlob reads them (src/runtime/library_module.cc; written by
// ModuleSerializer, src/target/codegen.cc):
//
//	<nbytes: u64> <count: u64> then count times <kind: str> and its module:
//	"_lib" (the library itself) nothing, "_import_tree" <row ptr: vec<u64>>
//	<child indices: vec<u64>>, any other kind its SaveToBinary.
//
// A module's SaveToBinary has no length before it: only the kinds dsoop reads
// can be passed over, and any other (CUDA code, ...) is ErrLegacyUnsupported,
// naming it. A graph executor factory's is
//
//	<graph JSON: str> <count: u64> <names: vec<str>> count tensors <name: str>
//
// (graph_executor_factory.cc, SaveToBinary).
func readLegacyBlob(blob io.ReaderAt, size uint64) (*legacyBlob, error) {
	r := &binReader{r: blob, limit: size}
	if nbytes := r.u64(); r.err == nil && nbytes != size-8 {
		return nil, fmt.Errorf("%s: %d bytes, says %d", legacyDevBlobSymbol, size-8, nbytes)
	}
	count := r.u64()
	if r.err == nil && count > maxEmbeddedModules {
		return nil, fmt.Errorf("%s: %d modules", legacyDevBlobSymbol, count)
	}
	out := &legacyBlob{}
	for i := uint64(0); r.err == nil && i < count; i++ {
		switch kind := r.str(); kind {
		case "_lib":
		case "_import_tree":
			r.skipWords(r.u64())
			r.skipWords(r.u64())
		case graphFactoryKind:
			if out.factory {
				return nil, fmt.Errorf("%w: it holds two graph executor factories", ErrLegacyUnsupported)
			}
			out.factory = true
			n := r.u64()
			if r.err == nil && n > maxGraphJSONBytes {
				r.err = fmt.Errorf("a graph JSON of %d bytes", n)
			}
			out.graphJSON = r.read(n)
			count := r.u64()
			out.params = readNamedParams(r, readNames(r, r.u64()), count)
			out.name = r.strMax(4096)
		default:
			if r.err != nil {
				break
			}
			return nil, fmt.Errorf("%w: it embeds a module of kind %q (%s), which only the runtime of TVM <= 0.20 "+
				"rebuilds: dsoop runs its CPU functions and graph executor models only", ErrLegacyUnsupported, kind,
				legacyDevBlobSymbol)
		}
	}
	if r.err == nil && r.left() != 0 {
		r.err = fmt.Errorf("%d bytes past the last module", r.left())
	}
	if r.err != nil {
		return nil, fmt.Errorf("%s: %w", legacyDevBlobSymbol, r.err)
	}
	if out.factory && (out.name == "" || isReservedName(out.name)) {
		return nil, fmt.Errorf("%s: a graph executor factory named %q", legacyDevBlobSymbol, out.name)
	}
	return out, nil
}
