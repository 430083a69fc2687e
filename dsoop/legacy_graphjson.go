package dsoop

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"regexp"
	"strconv"
	"strings"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

// Bounds on what a graph may claim, far above what relay.build writes: a
// corrupted graph must fail here, not make the executor allocate or index past
// what exists.
const (
	maxGraphJSONBytes = 256 << 20
	maxGraphNodes     = 1 << 20
	maxGraphOpArgs    = 1 << 16
	maxTensorBytes    = 1 << 40
)

// graphEntry is one tensor of a graph: a node's output, laid over a storage.
type graphEntry struct {
	dtype   dlpack.DataType // as the kernels take it: bool is uint1
	shape   []int64
	storage int
	bytes   int64
}

// graphOp is a tvm_op node: the kernel called on its inputs' and outputs' entries.
type graphOp struct {
	name, fn string // fn "" for __nop, which shares its input's storage and runs nothing
	args     []int  // entry ids: the inputs, then the outputs
	flatten  bool
}

// graphInput is a graph input (a "null" node): the model's, or a param.
type graphInput struct {
	name  string
	entry int
}

// legacyGraph is a relay.build graph as read from its JSON, and verified: the
// nodes in an order that computes every entry before it is read, every index
// in range, every entry's bytes within its storage.
type legacyGraph struct {
	entries []graphEntry
	storage []int64 // the bytes of each storage: the largest of its entries
	ops     []graphOp
	inputs  []graphInput
	outputs []int // entry ids
}

// The JSON of TVM's graph executor (graph_executor.h, GraphExecutor::Load).
type graphJSON struct {
	Nodes      []graphJSONNode            `json:"nodes"`
	ArgNodes   []int64                    `json:"arg_nodes"`
	Heads      [][]int64                  `json:"heads"`
	NodeRowPtr []int64                    `json:"node_row_ptr"`
	Attrs      map[string]json.RawMessage `json:"attrs"`
}

type graphJSONNode struct {
	Op     string            `json:"op"`
	Name   string            `json:"name"`
	Inputs [][]int64         `json:"inputs"`
	Attrs  map[string]string `json:"attrs"`
}

// readGraphJSON reads and verifies a graph executor's JSON. What it cannot run
// (a node that is not a kernel, a device other than the CPU, a storage scope)
// is ErrLegacyUnsupported, saying what.
func readGraphJSON(data []byte) (*legacyGraph, error) {
	g, err := parseGraphJSON(data)
	if err != nil {
		return nil, fmt.Errorf("graph JSON: %w", err)
	}
	return g, nil
}

func parseGraphJSON(data []byte) (*legacyGraph, error) {
	if len(data) > maxGraphJSONBytes {
		return nil, fmt.Errorf("%d bytes, more than %d", len(data), maxGraphJSONBytes)
	}
	var j graphJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return nil, err
	}
	if len(j.Nodes) == 0 || len(j.Nodes) > maxGraphNodes {
		return nil, fmt.Errorf("%d nodes", len(j.Nodes))
	}
	// node_row_ptr: where each node's entries begin; a node has one entry per output.
	if len(j.NodeRowPtr) != len(j.Nodes)+1 || j.NodeRowPtr[0] != 0 {
		return nil, fmt.Errorf("node_row_ptr has %d items for %d nodes", len(j.NodeRowPtr), len(j.Nodes))
	}
	numOutputs := make([]int, len(j.Nodes))
	for i, n := range j.Nodes {
		outputs, err := nodeOutputs(n)
		if err != nil {
			return nil, fmt.Errorf("node %d (%q): %w", i, n.Name, err)
		}
		if j.NodeRowPtr[i+1]-j.NodeRowPtr[i] != int64(outputs) {
			return nil, fmt.Errorf("node %d (%q): node_row_ptr gives it %d entries, it has %d outputs",
				i, n.Name, j.NodeRowPtr[i+1]-j.NodeRowPtr[i], outputs)
		}
		numOutputs[i] = outputs
	}
	numEntries := j.NodeRowPtr[len(j.Nodes)]
	if numEntries > maxGraphNodes*4 {
		return nil, fmt.Errorf("%d entries", numEntries)
	}
	g := &legacyGraph{}
	if err := g.readEntries(j.Attrs, int(numEntries)); err != nil {
		return nil, err
	}
	// An entry: a node's output, as [node, index, version].
	entry := func(ref []int64, before int) (int, error) {
		if len(ref) < 2 || len(ref) > 3 || ref[0] < 0 || ref[0] >= int64(before) || ref[1] < 0 || ref[1] >= int64(numOutputs[ref[0]]) {
			return 0, fmt.Errorf("the entry %v is not an output of a node before it", ref)
		}
		return int(j.NodeRowPtr[ref[0]] + ref[1]), nil
	}
	isArg := make([]bool, len(j.Nodes))
	for _, nid := range j.ArgNodes {
		if nid < 0 || nid >= int64(len(j.Nodes)) || isArg[nid] || j.Nodes[nid].Op != "null" {
			return nil, fmt.Errorf("arg_nodes: %d is not an input node, or is listed twice", nid)
		}
		isArg[nid] = true
	}
	for i, n := range j.Nodes {
		if n.Op == "null" {
			if !isArg[i] {
				return nil, fmt.Errorf("node %d (%q) is an input missing from arg_nodes", i, n.Name)
			}
			g.inputs = append(g.inputs, graphInput{name: n.Name, entry: int(j.NodeRowPtr[i])})
			continue
		}
		op := graphOp{name: n.Name, fn: n.Attrs["func_name"], flatten: n.Attrs["flatten_data"] == "1"}
		if op.fn == "__nop" {
			op.fn = ""
		}
		if len(n.Inputs)+numOutputs[i] > maxGraphOpArgs {
			return nil, fmt.Errorf("node %d (%q): %d inputs", i, n.Name, len(n.Inputs))
		}
		for _, ref := range n.Inputs {
			e, err := entry(ref, i)
			if err != nil {
				return nil, fmt.Errorf("node %d (%q): %w", i, n.Name, err)
			}
			op.args = append(op.args, e)
		}
		for k := range numOutputs[i] {
			op.args = append(op.args, int(j.NodeRowPtr[i])+k)
		}
		g.ops = append(g.ops, op)
	}
	if len(j.Heads) == 0 || len(j.Heads) > maxGraphOpArgs {
		return nil, fmt.Errorf("%d heads (outputs)", len(j.Heads))
	}
	for _, ref := range j.Heads {
		e, err := entry(ref, len(j.Nodes))
		if err != nil {
			return nil, fmt.Errorf("heads: %w", err)
		}
		g.outputs = append(g.outputs, e)
	}
	return g, nil
}

// nodeOutputs checks a node's kind and gives its number of outputs.
func nodeOutputs(n graphJSONNode) (int, error) {
	if strings.ContainsRune(n.Name, 0) {
		return 0, errors.New("a name with a NUL byte")
	}
	switch n.Op {
	case "null":
		return 1, nil
	case "tvm_op":
	default:
		return 0, fmt.Errorf("%w: a node of kind %q: dsoop's graph executor runs tvm_op and input (null) nodes",
			ErrLegacyUnsupported, n.Op)
	}
	fn := n.Attrs["func_name"]
	if fn == "" || strings.ContainsRune(fn, 0) {
		return 0, fmt.Errorf("bad func_name %q", fn)
	}
	inputs, err := strconv.Atoi(n.Attrs["num_inputs"])
	if err != nil || inputs != len(n.Inputs) {
		return 0, fmt.Errorf("num_inputs %q, with %d inputs", n.Attrs["num_inputs"], len(n.Inputs))
	}
	outputs, err := strconv.Atoi(n.Attrs["num_outputs"])
	if err != nil || outputs < 1 || outputs > maxGraphOpArgs {
		return 0, fmt.Errorf("num_outputs %q", n.Attrs["num_outputs"])
	}
	if f := n.Attrs["flatten_data"]; f != "" && f != "0" && f != "1" {
		return 0, fmt.Errorf("flatten_data %q", f)
	}
	if fn == "__nop" && (inputs != 1 || outputs != 1) {
		return 0, errors.New("a __nop of more than one input or output")
	}
	return outputs, nil
}

// graphAttr reads attrs[key], ["<kind>", value], into v; false when absent.
func graphAttr(attrs map[string]json.RawMessage, key, kind string, v any) (bool, error) {
	raw, ok := attrs[key]
	if !ok {
		return false, nil
	}
	var pair []json.RawMessage
	var got string
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 || json.Unmarshal(pair[0], &got) != nil || got != kind {
		return false, fmt.Errorf("attrs.%s is not [%q, ...]", key, kind)
	}
	if err := json.Unmarshal(pair[1], v); err != nil {
		return false, fmt.Errorf("attrs.%s: %w", key, err)
	}
	return true, nil
}

// readEntries reads the entries' dtypes, shapes and storage from the graph's
// attrs, and sizes each storage as TVM's SetupStorage does: the largest of
// its entries, rounded up to 4 bytes.
func (g *legacyGraph) readEntries(attrs map[string]json.RawMessage, n int) error {
	var dtypes []string
	var shapes [][]int64
	var storage, devices []int64
	var scopes []string
	for _, a := range []struct {
		key, kind string
		v         any
		required  bool
	}{
		{"dltype", "list_str", &dtypes, true},
		{"shape", "list_shape", &shapes, true},
		{"storage_id", "list_int", &storage, true},
		{"device_index", "list_int", &devices, false},
		{"storage_scope", "list_str", &scopes, false},
	} {
		found, err := graphAttr(attrs, a.key, a.kind, a.v)
		if err != nil {
			return err
		}
		if a.required && !found {
			return fmt.Errorf("no attrs.%s", a.key)
		}
	}
	if len(dtypes) != n || len(shapes) != n || len(storage) != n || (devices != nil && len(devices) != n) ||
		(scopes != nil && len(scopes) != n) {
		return fmt.Errorf("attrs of %d, %d and %d entries for %d", len(dtypes), len(shapes), len(storage), n)
	}
	g.entries = make([]graphEntry, n)
	for i := range n {
		if devices != nil && devices[i] != int64(dlpack.CPU) {
			return fmt.Errorf("%w: entry %d is on device type %d (device_index): dsoop runs relay.build models on "+
				"the CPU only (1); a CUDA model (2) needs TVM's own runtime", ErrLegacyUnsupported, i, devices[i])
		}
		if scopes != nil && scopes[i] != "" && scopes[i] != "global" {
			return fmt.Errorf("%w: entry %d has storage scope %q", ErrLegacyUnsupported, i, scopes[i])
		}
		dtype, err := parseLegacyDType(dtypes[i])
		if err != nil {
			return fmt.Errorf("entry %d: %w", i, err)
		}
		size, err := tensorBytes(dtype, shapes[i])
		if err != nil {
			return fmt.Errorf("entry %d: %w", i, err)
		}
		if storage[i] < 0 || storage[i] >= int64(n) {
			return fmt.Errorf("entry %d: storage_id %d", i, storage[i])
		}
		g.entries[i] = graphEntry{dtype: dtype, shape: shapes[i], storage: int(storage[i]), bytes: size}
		for int(storage[i]) >= len(g.storage) {
			g.storage = append(g.storage, 0)
		}
		g.storage[storage[i]] = max(g.storage[storage[i]], (size+3)/4*4)
	}
	return nil
}

// tensorBytes is the bytes of a tensor of that dtype and shape, bounded.
func tensorBytes(dtype dlpack.DataType, shape []int64) (int64, error) {
	if len(shape) > maxTensorDims {
		return 0, fmt.Errorf("a shape of %d dimensions", len(shape))
	}
	elemBits := uint64(dtype.Bits) * uint64(dtype.Lanes)
	total := (elemBits + 7) / 8
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("the shape %v", shape)
		}
		hi, lo := bits.Mul64(total, uint64(d))
		if hi != 0 || lo > maxTensorBytes {
			return 0, fmt.Errorf("the shape %v: more than %d bytes", shape, int64(maxTensorBytes))
		}
		total = lo
	}
	return int64(total), nil
}

var legacyDTypePattern = regexp.MustCompile(`^(int|uint|float|bfloat)(8|16|32|64)(?:x([0-9]{1,4}))?$`)

// parseLegacyDType reads a dtype as TVM writes it (DLDataType2String): int32,
// float16, uint8x4, bool. bool comes as old TVM's kernels take it: uint1.
func parseLegacyDType(s string) (dlpack.DataType, error) {
	if s == "bool" {
		return dlpack.DataType{Code: dlpack.UInt, Bits: 1, Lanes: 1}, nil
	}
	m := legacyDTypePattern.FindStringSubmatch(s)
	if m == nil {
		return dlpack.DataType{}, fmt.Errorf("%w: the dtype %q", ErrLegacyUnsupported, s)
	}
	codes := map[string]dlpack.DataTypeCode{"int": dlpack.Int, "uint": dlpack.UInt, "float": dlpack.Float, "bfloat": dlpack.Bfloat}
	b, _ := strconv.Atoi(m[2])
	lanes := 1
	if m[3] != "" {
		lanes, _ = strconv.Atoi(m[3])
	}
	if lanes < 1 || lanes > math.MaxUint16 || (m[1] == "bfloat" && b != 16) {
		return dlpack.DataType{}, fmt.Errorf("%w: the dtype %q", ErrLegacyUnsupported, s)
	}
	return dlpack.DataType{Code: codes[m[1]], Bits: uint8(b), Lanes: uint16(lanes)}, nil
}
