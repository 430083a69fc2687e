// Package tfbridge puts calls of TVM functions into TensorFlow graphs built with
// the Go TF bindings (github.com/wamuir/graft), as TVMDSOOp nodes.
//
// Importing the package registers TVMDSOOp and TvmDsoOp with the process's
// TensorFlow by linking the kernels into the binary. A Go program must not load
// the c-shared op library (libtvm_dso_op.so) with tf.LoadLibrary instead: that
// library carries a second Go runtime, and two Go runtimes in one process are not
// supported. SavedModels holding TVMDSOOp nodes load with tf.LoadSavedModel once
// this package is imported.
package tfbridge

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"

	tf "github.com/wamuir/graft/tensorflow"
	"github.com/wamuir/graft/tensorflow/op"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
	// The TVMDSOOp kernels, registered by C++ static initialisers at start-up.
	_ "github.com/tvmdsoop/tvmdsoop/kernels"
)

// OpType is the TensorFlow op that calls a TVM function.
const OpType = "TVMDSOOp"

// DynamicDim marks, in Output.Shape, a size given at run time by CallWithDims.
const DynamicDim = -1

// Module names a TVM library (made by TVM's export_library, or any library that
// exports TVM-FFI functions). The library is loaded by the op when the graph
// runs, once per process per path while its kernels use it.
type Module struct {
	path   string
	sha256 string
	model  bool // a whole model: its functions return their outputs
}

// NewModule names the library at path (made absolute, so graphs do not depend on
// the working directory). The graph records the file's SHA-256, and the op
// refuses a library with another one. The library is loaded now (as the op
// would load it; probed first, as no digest is pinned yet) to learn whether it
// is a whole model (a Relax VM executable, or a relay.build model with its
// graph embedded), whose functions return their outputs. A file that does not
// exist is an error wrapping fs.ErrNotExist, as tf_op.Module's is: a graph
// naming it could only fail.
func NewModule(path string) (*Module, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("tfbridge: library %q: %w", path, err)
	}
	// The digest recorded is that of the bytes loaded. Not kept loaded: the op
	// loads the library again when the graph runs, and unloads it with the
	// graph's last kernel of it.
	module, err := dsoop.Open(abs)
	if err != nil {
		return nil, fmt.Errorf("tfbridge: %w", err)
	}
	defer module.Close()
	return &Module{path: abs, sha256: module.SHA256(), model: module.IsModel()}, nil
}

// IsModel reports whether the library is a whole model (see dsoop.Module.IsModel):
// a Relax VM executable, or a relay.build model of one file.
func (m *Module) IsModel() bool { return m.model }

// Path is the library's absolute path.
func (m *Module) Path() string { return m.path }

// SHA256 is the digest the graph will require of the library ("" for none).
func (m *Module) SHA256() string { return m.sha256 }

// Output declares one output of a function.
type Output struct {
	// DType is the output's type; zero means the first input's type.
	DType tf.DataType
	// Shape is the output's shape; nil means the first input's shape. Sizes of
	// DynamicDim are given when the graph runs (see Func.CallWithDims); use an
	// empty, non-nil slice for a scalar. For a function that returns its outputs
	// (a model's, or one made WithReturns), Shape is what the output must have:
	// nil for any shape, DynamicDim for a size not checked.
	Shape []int64
}

// Option configures a Func.
type Option func(*Func) error

// WithOutputs declares the function's outputs, in the order the TVM function
// takes them after its inputs. Without it a function has one output of the
// first input's type and shape.
func WithOutputs(outputs ...Output) Option {
	return func(f *Func) error {
		if len(outputs) == 0 {
			return errors.New("a function needs at least one output")
		}
		for i, o := range outputs {
			for _, d := range o.Shape {
				if d < DynamicDim {
					return fmt.Errorf("output %d has size %d in shape %v; sizes are >= 0 or DynamicDim", i, d, o.Shape)
				}
			}
		}
		f.outputs = outputs
		return nil
	}
}

// WithAlignment sets the least alignment in bytes (a power of two, default 64)
// of the buffers handed to TVM; misaligned ones are copied through aligned memory.
func WithAlignment(alignment int64) Option {
	return func(f *Func) error {
		if alignment < 1 || alignment&(alignment-1) != 0 {
			return fmt.Errorf("alignment must be a power of two, got %d", alignment)
		}
		f.alignment = alignment
		return nil
	}
}

// WithReturns declares a function that returns its outputs rather than writing
// outputs TF allocates. Every function of a whole model does; this is for
// other libraries' functions that do.
func WithReturns() Option {
	return func(f *Func) error {
		f.returns = true
		return nil
	}
}

// WithInplace declares outputs that the function may write over one of its
// inputs, as {output: input}: an element-wise function's output over the input
// of the same dtype and shape. Where TF allows it (nothing else uses the input's
// buffer) the op then hands TVM the input's buffer as the output, and allocates
// nothing; else it allocates as usual. Declare it only for a function that reads
// each input element before it writes the output element in its place.
func WithInplace(inplace map[int]int) Option {
	return func(f *Func) error {
		for o, i := range inplace {
			if o < 0 || i < 0 {
				return fmt.Errorf("inplace maps an output to an input, both >= 0, got %d: %d", o, i)
			}
		}
		f.inplace = maps.Clone(inplace) // the caller's map may change after
		return nil
	}
}

// Func is a function of a Module that can be added to graphs.
type Func struct {
	module    *Module
	name      string
	outputs   []Output
	alignment int64
	returns   bool
	inplace   map[int]int
}

// Func declares the function name of the module.
func (m *Module) Func(name string, opts ...Option) (*Func, error) {
	if name == "" {
		return nil, errors.New("tfbridge: empty function name")
	}
	f := &Func{module: m, name: name, outputs: []Output{{}}, alignment: 64, returns: m.model}
	for _, opt := range opts {
		if err := opt(f); err != nil {
			return nil, fmt.Errorf("tfbridge: function %q of %s: %w", name, m.path, err)
		}
	}
	if err := f.checkInplace(); err != nil {
		return nil, fmt.Errorf("tfbridge: function %q of %s: %w", name, m.path, err)
	}
	return f, nil
}

// checkInplace checks what WithInplace declared against the other options,
// whichever order they came in; the inputs are checked when the function is called.
func (f *Func) checkInplace() error {
	if len(f.inplace) > 0 && f.returns {
		return errors.New("the function returns its outputs, so none can be written over an input (WithInplace)")
	}
	for o := range f.inplace {
		if o >= len(f.outputs) {
			return fmt.Errorf("WithInplace names output %d, but the function has %d output(s)", o, len(f.outputs))
		}
	}
	return nil
}

// Call adds a TVMDSOOp calling the function on inputs to the scope's graph and
// returns its outputs. As with the ops of the op package, a failure is recorded
// in the scope (s.Err()) and Call returns nil. Each call adds its nodes under a
// sub-scope named after the function, so a graph may call a function many times.
func (f *Func) Call(s *op.Scope, inputs ...tf.Output) []tf.Output {
	return f.call(s, nil, inputs)
}

// CallWithDims is Call for outputs whose shapes hold DynamicDim sizes: dims is a
// 1-D int64 tensor with those sizes, in order across the outputs, read at every
// run.
func (f *Func) CallWithDims(s *op.Scope, dims tf.Output, inputs ...tf.Output) []tf.Output {
	return f.call(s, &dims, inputs)
}

func (f *Func) call(s *op.Scope, dims *tf.Output, inputs []tf.Output) []tf.Output {
	if s.Err() != nil {
		return nil
	}
	s = s.SubScope(f.name)
	if dims != nil && f.returns {
		s.UpdateErr(OpType, fmt.Errorf("function %q of %s returns its outputs: it takes no output sizes (use Call)", f.name, f.module.path))
		return nil
	}
	var outputDims tf.OutputList // none when every output shape is static: no node for TF to run
	if dims != nil {
		outputDims = tf.OutputList{*dims}
	}
	dtypes := make([]tf.DataType, len(f.outputs))
	shapes := make([]tf.Shape, len(f.outputs))
	for i, o := range f.outputs {
		if (o.DType == 0 || (o.Shape == nil && !f.returns)) && len(inputs) == 0 {
			s.UpdateErr(OpType, fmt.Errorf("function %q of %s: output %d takes the first input's type or shape, but there is no input", f.name, f.module.path, i))
			return nil
		}
		dtypes[i] = o.DType
		if o.DType == 0 {
			dtypes[i] = inputs[0].DataType()
		}
		if o.Shape != nil {
			shapes[i] = tf.MakeShape(o.Shape...)
		} // the zero Shape has an unknown rank: the first input's shape, or for a returning function any shape
	}
	var inplace []int64 // the op's attr: per output, the input it may be written over, or -1
	if len(f.inplace) > 0 {
		inplace = make([]int64, len(f.outputs))
		for o := range inplace {
			inplace[o] = -1
		}
		for o, i := range f.inplace {
			if i >= len(inputs) {
				s.UpdateErr(OpType, fmt.Errorf("function %q of %s: output %d may be written over input %d (WithInplace), but the call has %d input(s)", f.name, f.module.path, o, i, len(inputs)))
				return nil
			}
			inplace[o] = int64(i)
		}
	}
	library := op.Const(s.SubScope("library"), f.module.path)
	attrs := map[string]interface{}{
		"Tout":          dtypes,
		"output_shapes": shapes,
		"func_name":     f.name,
		"lib_sha256":    f.module.sha256,
		"alignment":     f.alignment,
		"returns":       f.returns,
	}
	if inplace != nil {
		attrs["inplace"] = inplace
	}
	operation := s.AddOperation(tf.OpSpec{
		Type:  OpType,
		Input: []tf.Input{tf.OutputList(inputs), outputDims, library},
		Attrs: attrs,
	})
	if operation == nil {
		return nil
	}
	outputs := make([]tf.Output, operation.NumOutputs())
	for i := range outputs {
		outputs[i] = operation.Output(i)
	}
	return outputs
}
