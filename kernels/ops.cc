// ops.cc: the op definitions, TVMDSOOp, the legacy TvmDsoOp and tf_op.auto's
// TVMDSOOpCluster, registered with TensorFlow in static initialisers, and their
// shape functions. Their kernels are in tvm_dso_op_kernel.cc, legacy_kernel.cc
// and cluster_kernel.cc.
#include "kernels/ops.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/framework/tensor.h"

namespace tvmdsoop {
namespace internal __attribute__((visibility("hidden"))) {

int64_t NumDynamicDims(absl::Span<const ::tensorflow::PartialTensorShape> shapes) {
  int64_t n = 0;
  for (const ::tensorflow::PartialTensorShape& s : shapes) {
    for (int d = 0; d < s.dims(); ++d) n += s.dim_size(d) < 0 ? 1 : 0;
  }
  return n;
}

}  // namespace internal

namespace {

using ::tensorflow::DataTypeVector;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;
using internal::NumDynamicDims;
namespace errors = ::tensorflow::errors;

Status TVMDSOOpShape(InferenceContext* c) {
  std::vector<PartialTensorShape> shapes;
  TF_RETURN_IF_ERROR(c->GetAttr("output_shapes", &shapes));
  if (static_cast<int>(shapes.size()) != c->num_outputs()) {
    return errors::InvalidArgument("", shapes.size(), " output shapes for ",
                                   c->num_outputs(), " output dtypes");
  }
  DataTypeVector arg_types;
  TF_RETURN_IF_ERROR(c->GetAttr("Tin", &arg_types));
  const int num_in = static_cast<int>(arg_types.size());
  const int num_dims_parts = c->num_inputs() - num_in - 1;
  ShapeHandle unused;
  for (int k = 0; k < num_dims_parts; ++k) {
    TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(num_in + k), 1, &unused));
  }
  TF_RETURN_IF_ERROR(c->WithRankAtMost(c->input(num_in + num_dims_parts), 1, &unused));
  // A function that returns its outputs gives them the shapes it likes: only
  // what output_shapes declares is known (-1 dimensions stay unknown).
  bool returns = false;
  TF_RETURN_IF_ERROR(c->GetAttr("returns", &returns));
  // The sizes output_dims gives, one per -1 in output_shapes, where the graph
  // knows them: from its constant parts. A part whose values are unknown but whose
  // length is known is skipped; after one of unknown length nothing is known.
  const auto num_dynamic = static_cast<size_t>(NumDynamicDims(shapes));
  std::vector<std::optional<int64_t>> dim_values;
  for (int k = 0; k < num_dims_parts && !returns && dim_values.size() < num_dynamic; ++k) {
    if (const Tensor* part = c->input_tensor(num_in + k); part != nullptr) {
      const auto values = part->flat<int64_t>();
      dim_values.insert(dim_values.end(), values.data(), values.data() + values.size());
      continue;
    }
    const ShapeHandle shape = c->input(num_in + k);
    if (!c->RankKnown(shape)) break;
    const int64_t length = c->Rank(shape) == 0 ? 1 : c->Value(c->Dim(shape, 0));
    if (length < 0) break;
    // At most as many as are wanted: a graph may give a part of any length.
    const size_t skipped = std::min(static_cast<size_t>(length), num_dynamic - dim_values.size());
    dim_values.insert(dim_values.end(), skipped, std::nullopt);
  }
  int next_dynamic = 0;
  for (int i = 0; i < c->num_outputs(); ++i) {
    if (shapes[i].unknown_rank()) {
      c->set_output(i, num_in > 0 && !returns ? c->input(0) : c->UnknownShape());
      continue;
    }
    std::vector<tensorflow::shape_inference::DimensionHandle> dims;
    for (int d = 0; d < shapes[i].dims(); ++d) {
      int64_t size = shapes[i].dim_size(d);
      if (size < 0 && next_dynamic < static_cast<int>(dim_values.size()) && dim_values[next_dynamic]) {
        size = *dim_values[next_dynamic];
        if (size < 0) {
          return errors::InvalidArgument("output ", i, " dimension ", d, " is ", size,
                                         "; sizes must be >= 0");
        }
      }
      if (shapes[i].dim_size(d) < 0) ++next_dynamic;
      dims.push_back(size < 0 ? c->UnknownDim() : c->MakeDim(size));
    }
    c->set_output(i, c->MakeShape(dims));
  }
  return Status();
}

// TVMDSOOpShape, with the function named in its errors.
Status TVMDSOOpShapeWithContext(InferenceContext* c) {
  const Status status = TVMDSOOpShape(c);
  if (status.ok()) return status;
  std::string func_name;
  TF_RETURN_IF_ERROR(c->GetAttr("func_name", &func_name));
  return Status(status.code(), absl::StrCat("TVMDSOOp: function '", func_name, "': ",
                                            status.message()));
}

Status LegacyTvmDsoOpShape(InferenceContext* c) {
  bool has_static = false;
  TF_RETURN_IF_ERROR(c->GetAttr("has_static_output_shape", &has_static));
  const int num_in = c->num_inputs() - 1;
  if (has_static) {
    std::vector<int64_t> dims;
    TF_RETURN_IF_ERROR(c->GetAttr("static_output_shape", &dims));
    std::vector<tensorflow::shape_inference::DimensionHandle> handles;
    for (int64_t d : dims) {
      if (d < 0) return errors::InvalidArgument("TvmDsoOp: static_output_shape has size ", d);
      handles.push_back(c->MakeDim(d));
    }
    c->set_output(0, c->MakeShape(handles));
    return Status();
  }
  ShapeHandle dynamic = c->input(num_in);
  if (c->RankKnown(dynamic) && c->Rank(dynamic) == 1) {
    ShapeHandle s;
    TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(num_in, &s));
    c->set_output(0, s);
  } else if (c->RankKnown(dynamic) && num_in > 0) {
    c->set_output(0, c->input(0));
  } else {
    c->set_output(0, c->UnknownShape());
  }
  return Status();
}

}  // namespace

REGISTER_OP("TVMDSOOp")
    .Input("args: Tin")
    .Input("output_dims: output_dims_parts * int64")
    .Input("library: string")
    .Output("outputs: Tout")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 1")
    .Attr("output_dims_parts: int >= 0 = 1")
    .Attr("func_name: string")
    .Attr("lib_sha256: string = ''")
    .Attr("graph_sha256: list(string) = []")
    .Attr("output_shapes: list(shape)")
    .Attr("alignment: int = 64")
    .Attr("returns: bool = false")
    .Attr("grad_func: string = ''")
    .Attr("grad_lib_sha256: string = ''")
    .Attr("grad_returns: bool = false")
    .Attr("inplace: list(int) = []")
    .SetShapeFn(TVMDSOOpShapeWithContext)
    .Doc(R"doc(
Calls function `func_name` of the TVM module at path `library` with the inputs,
then the outputs, as DLTensors (TVM's destination-passing convention). A function
of a whole model (a Relax VM executable or relay.build graph), or any function when `returns` is true,
takes the inputs only and returns the outputs.

library: the library's path, a scalar; a tensor so that SavedModels can carry the
  library as an asset and find it wherever they are loaded. A vector: the
  library, then the library of the gradient function (carried, never called here).
lib_sha256: the SHA-256 (hex) the library must have; empty for no check.
graph_sha256: for a relay.build model of three files, the SHA-256 (hex, or
  empty for no check) of its graph JSON and of its params, whose paths follow
  the library's in `library` (a vector then); empty for any other function.
grad_func: the function giving the gradient (tf_op's registered gradient calls
  it); empty when the op has none. It is in the op's own library, or in
  library[1] when `library` is a vector, whose SHA-256 is `grad_lib_sha256`.
grad_returns: the gradient function returns its outputs.
output_dims: the sizes of the output dimensions given as -1 in `output_shapes`, in
  order: `output_dims_parts` scalars or vectors, concatenated. None when every
  shape is static (graphs written before `output_dims_parts` have one vector).
output_shapes: one per output; an unknown rank means the first input's shape
  (for returning functions: any shape, not checked; -1 dimensions likewise).
returns: the function returns its outputs instead of writing them (implied for
  the functions of a model).
alignment: the least alignment, in bytes, of every buffer handed to TVM; misaligned
  buffers are copied through aligned scratch memory.
inplace: empty, or for each output the input whose buffer it may be written over
  (-1: none). TF hands that buffer over only when nothing else uses the input and
  its dtype and size are the output's; else the output is allocated. For
  functions that tolerate it (element-wise ones); not for returning functions.
)doc");

// What the automatic clustering pass (auto_pass.cc) puts in place of a part of
// a graph: the part runs as TVM compiles it for its inputs' shapes, or as the
// function it was (cluster_kernel.cc). Stateful: TF must not evaluate it while
// optimising a graph (a compile), nor merge two of them.
REGISTER_OP("TVMDSOOpCluster")
    .Input("args: Tin")
    .Input("libraries: Nlib * string")
    .Output("outputs: Tout")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 1")
    .Attr("function: func")
    .Attr("cluster: string")
    .Attr("Nlib: int >= 0 = 0")
    .Attr("library_sha256: list(string) = []")
    .Attr("library_shapes: list(string) = []")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::UnknownShape)
    .Doc(R"doc(
Runs a part of a graph that tf_op.auto clustered: TVM's compiled code for the
inputs' shapes where it has it and it is faster, else `function`, the part as it
was in TF.

function: the part of the graph, as a function of the op's inputs and outputs.
cluster: the cluster's name in tf_op.auto.report().
libraries: the paths of libraries compiled ahead (tf_op.auto.convert), one for
  each input shape of library_shapes, verified against library_sha256. Empty in
  the clusters the pass makes.
library_shapes: the input shapes each of libraries was compiled for, as
  "[1,224,224,3] [64]".
)doc");

// The interface of TVM 0.7-0.19's op, unchanged, so its GraphDefs and SavedModels load.
REGISTER_OP("TvmDsoOp")
    .Input("input_args: ListT")
    .Attr("ListT: list({float16, float32, float64, int8, int16, int32, int64, uint8, uint16, uint32, uint64})")
    .Input("dynamic_output_shape: int64")
    .Output("output: output_dtype")
    .Attr("lib_path: string")
    .Attr("func_name: string")
    .Attr("output_dtype: {float16, float32, float64, int8, int16, int32, int64, uint8, uint16, uint32, uint64} = DT_FLOAT")
    .Attr("static_output_shape: list(int) >= 0 = []")
    .Attr("has_static_output_shape: bool")
    .SetShapeFn(LegacyTvmDsoOpShape);

}  // namespace tvmdsoop
