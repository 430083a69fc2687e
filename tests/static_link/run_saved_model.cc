// run_saved_model: the TensorFlow Serving deployment path in miniature. The
// TVMDSOOp kernels come from the static archive libtvm_dso_op.a linked into this
// binary (whole-archive, as Bazel's alwayslink does), never from dlopen; the
// SavedModel is loaded and run through TensorFlow's C API.
//
//   run_saved_model MODEL_DIR INPUT_TENSOR OUTPUT_TENSOR [OUTPUT_TENSOR...] -- X0 X1 ...
//
// Tensors are "operation:index" names from the model's signature. The input is a
// float32 vector of the X values; each output is printed on its own line, its
// values separated by spaces. Exit status 1 on any error, with TF's message.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "libtvm_dso_op.h"  // the archive's header (build/static/)
#include "tensorflow/c/c_api.h"

namespace {

struct StatusDeleter {
  void operator()(TF_Status* s) const { TF_DeleteStatus(s); }
};
struct GraphDeleter {
  void operator()(TF_Graph* g) const { TF_DeleteGraph(g); }
};
struct TensorDeleter {
  void operator()(TF_Tensor* t) const { TF_DeleteTensor(t); }
};
struct OptionsDeleter {
  void operator()(TF_SessionOptions* o) const { TF_DeleteSessionOptions(o); }
};
using Status = std::unique_ptr<TF_Status, StatusDeleter>;
using Graph = std::unique_ptr<TF_Graph, GraphDeleter>;
using Tensor = std::unique_ptr<TF_Tensor, TensorDeleter>;

int Fail(const std::string& what, TF_Status* status = nullptr) {
  std::fprintf(stderr, "run_saved_model: %s%s%s\n", what.c_str(), status ? ": " : "",
               status ? TF_Message(status) : "");
  return 1;
}

// "name:index" in graph, or an Output with a null oper.
TF_Output FindTensor(TF_Graph* graph, const std::string& name) {
  const size_t colon = name.rfind(':');
  const std::string op = colon == std::string::npos ? name : name.substr(0, colon);
  const int index = colon == std::string::npos ? 0 : std::atoi(name.c_str() + colon + 1);
  return TF_Output{TF_GraphOperationByName(graph, op.c_str()), index};
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> names;
  std::vector<float> values;
  bool after_separator = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      after_separator = true;
    } else if (after_separator) {
      values.push_back(std::strtof(argv[i], nullptr));
    } else {
      names.push_back(argv[i]);
    }
  }
  if (names.size() < 3) {
    return Fail("usage: run_saved_model MODEL_DIR INPUT OUTPUT [OUTPUT...] -- X0 X1 ...");
  }

  // A call into the archive: the op library is in this binary, not loaded.
  std::fprintf(stderr, "run_saved_model: TVMDSOOp %s linked in\n", TVMDSOOpVersion());

  Status status(TF_NewStatus());
  Graph graph(TF_NewGraph());
  std::unique_ptr<TF_SessionOptions, OptionsDeleter> options(TF_NewSessionOptions());
  const char* tags[] = {"serve"};
  TF_Session* session = TF_LoadSessionFromSavedModel(options.get(), nullptr, names[0].c_str(), tags,
                                                     1, graph.get(), nullptr, status.get());
  if (TF_GetCode(status.get()) != TF_OK) return Fail("loading " + names[0], status.get());

  const TF_Output input = FindTensor(graph.get(), names[1]);
  if (input.oper == nullptr) return Fail("no tensor " + names[1]);
  std::vector<TF_Output> outputs;
  for (size_t i = 2; i < names.size(); ++i) {
    outputs.push_back(FindTensor(graph.get(), names[i]));
    if (outputs.back().oper == nullptr) return Fail("no tensor " + names[i]);
  }

  const int64_t dims[1] = {static_cast<int64_t>(values.size())};
  Tensor x(TF_AllocateTensor(TF_FLOAT, dims, 1, values.size() * sizeof(float)));
  std::memcpy(TF_TensorData(x.get()), values.data(), values.size() * sizeof(float));
  TF_Tensor* input_values[1] = {x.get()};
  std::vector<TF_Tensor*> output_values(outputs.size(), nullptr);
  TF_SessionRun(session, nullptr, &input, input_values, 1, outputs.data(), output_values.data(),
                static_cast<int>(outputs.size()), nullptr, 0, nullptr, status.get());
  int rc = 0;
  if (TF_GetCode(status.get()) != TF_OK) {
    rc = Fail("running the model", status.get());
  } else {
    for (TF_Tensor* t : output_values) {
      Tensor owned(t);
      const auto* data = static_cast<const float*>(TF_TensorData(t));
      const size_t n = TF_TensorByteSize(t) / sizeof(float);
      for (size_t i = 0; i < n; ++i) std::printf(i == 0 ? "%g" : " %g", data[i]);
      std::printf("\n");
    }
  }
  TF_CloseSession(session, status.get());
  TF_DeleteSession(session, status.get());
  return rc;
}
