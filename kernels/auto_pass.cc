// auto_pass.cc: the automatic clustering pass (tf_op.auto, docs/auto.md). It
// runs on every graph TF is about to execute (a function's, a Session's), after
// placement and TF's own graph optimisations and ahead of XLA's passes; finds
// the connected parts TVM can take (convolutions and matmuls, with the
// element-wise work around them) on one CPU device; and replaces each with one
// TVMDSOOpCluster node. The node keeps the part as a function, which it runs
// whenever TVM does not (cluster_kernel.cc).
//
// A graph it cannot handle is left as it was: every check runs before a cluster
// is rewritten, and a cluster's rewrite cannot fail halfway.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/match.h"
#include "kernels/auto_cluster.h"
#include "kernels/auto_settings.h"
#include "tensorflow/core/common_runtime/graph_constructor.h"
#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/function.pb.h"
#include "tensorflow/core/framework/graph_to_functiondef.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/graph/algorithm.h"
#include "tensorflow/core/graph/graph.h"
#include "tensorflow/core/graph/node_builder.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/util/device_name_utils.h"
#include "_cgo_export.h"

namespace tvmdsoop {

const char kClusterFunctionAttr[] = "_tvmdsoop_cluster";

namespace {

using ::tensorflow::DataType;
using ::tensorflow::DeviceNameUtils;
using ::tensorflow::Edge;
using ::tensorflow::FunctionDef;
using ::tensorflow::Graph;
using ::tensorflow::GraphOptimizationPass;
using ::tensorflow::GraphOptimizationPassOptions;
using ::tensorflow::NameAttrList;
using ::tensorflow::Node;
using ::tensorflow::NodeBuilder;
using ::tensorflow::OutputTensor;
using ::tensorflow::Status;
namespace errors = ::tensorflow::errors;

}  // namespace

// Each op is what TF's TFLite converter and TVM's TFLite frontend both take, in
// float32; fused forms are the ones TF's grappler makes before this pass runs
// (its remapper), which the compile worker takes apart again
// (tf_op/compiler/cluster.py).
const absl::flat_hash_map<std::string, Role>& SupportedOps() {
  static const auto* ops = new absl::flat_hash_map<std::string, Role>{
      {"Conv2D", Role::kAnchor},
      {"DepthwiseConv2dNative", Role::kAnchor},
      {"MatMul", Role::kAnchor},
      {"BatchMatMulV2", Role::kAnchor},
      {"BatchMatMulV3", Role::kAnchor},
      {"_FusedConv2D", Role::kAnchor},
      {"_FusedDepthwiseConv2dNative", Role::kAnchor},
      {"_FusedMatMul", Role::kAnchor},
      {"Einsum", Role::kAnchor},
      {"BiasAdd", Role::kMember},
      {"Relu", Role::kMember},
      {"Relu6", Role::kMember},
      {"Elu", Role::kMember},
      {"LeakyRelu", Role::kMember},
      {"Sigmoid", Role::kMember},
      {"Tanh", Role::kMember},
      {"Softmax", Role::kMember},
      {"Add", Role::kMember},
      {"AddV2", Role::kMember},
      {"AddN", Role::kMember},  // grappler's arithmetic optimiser makes them of chains of adds
      {"Sub", Role::kMember},
      {"Mul", Role::kMember},
      {"RealDiv", Role::kMember},
      {"Maximum", Role::kMember},
      {"Minimum", Role::kMember},
      {"SquaredDifference", Role::kMember},
      {"Square", Role::kMember},
      {"Sqrt", Role::kMember},
      {"Rsqrt", Role::kMember},
      {"Exp", Role::kMember},
      {"Neg", Role::kMember},
      {"Erf", Role::kMember},
      {"Erfc", Role::kMember},  // Keras 3's exact GELU; the worker computes it from ops TFLite has
      {"MaxPool", Role::kMember},
      {"AvgPool", Role::kMember},
      {"Mean", Role::kMember},
      {"Sum", Role::kMember},
      {"Max", Role::kMember},
      {"Reshape", Role::kMember},
      {"Squeeze", Role::kMember},
      {"ExpandDims", Role::kMember},
      {"Transpose", Role::kMember},
      {"ConcatV2", Role::kMember},
      {"Split", Role::kMember},  // an LSTM cell's gates
      {"Pad", Role::kMember},
      {"Identity", Role::kMember},
      {"FusedBatchNormV3", Role::kMember},
      {"_MklSwish", Role::kMember},  // x * sigmoid(x), as grappler's remapper fuses it with oneDNN on
  };
  return *ops;
}

namespace {

// The fused steps of _FusedConv2D / _FusedMatMul / _FusedDepthwiseConv2dNative
// that cluster.py takes apart.
bool SupportedFusion(const Node& n) {
  std::vector<std::string> fused;
  if (!tensorflow::TryGetNodeAttr(n.attrs(), "fused_ops", &fused)) return false;
  static const auto* steps = new absl::flat_hash_set<std::string>{
      "BiasAdd", "FusedBatchNorm", "Add", "Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid",
      "GeluExact"};
  return std::all_of(fused.begin(), fused.end(), [](const std::string& s) { return steps->contains(s); });
}

// The inputs of an op a cluster may take from a constant of any dtype (shapes,
// axes, permutations): copied into the cluster's function, so TVM sees them.
bool IsConstant(const Node& n) { return n.type_string() == "Const"; }

// Whether n can be in a cluster on its own terms: a supported op, float32
// everywhere but constant inputs, on a CPU, no control edges, not XLA's.
bool Clusterable(const Node& n) {
  if (!n.IsOp()) return false;
  const auto& ops = SupportedOps();
  if (!ops.contains(n.type_string())) return false;
  if (absl::StartsWith(n.type_string(), "_Fused") && !SupportedFusion(n)) return false;
  if (ClaimedElsewhere(n)) return false;
  DeviceNameUtils::ParsedName device;
  if (n.assigned_device_name().empty() || !DeviceNameUtils::ParseFullName(n.assigned_device_name(), &device) ||
      device.type != "CPU") {
    return false;
  }
  for (const Edge* e : n.in_edges()) {
    if (e->IsControlEdge()) {
      if (!e->src()->IsSource()) return false;
      continue;
    }
    if (e->src()->output_type(e->src_output()) != tensorflow::DT_FLOAT && !IsConstant(*e->src())) return false;
  }
  for (const Edge* e : n.out_edges()) {
    if (e->IsControlEdge() && !e->dst()->IsSink()) return false;
  }
  for (int o = 0; o < n.num_outputs(); ++o) {
    // FusedBatchNormV3's extra outputs are float32 too, and unused at inference.
    if (n.output_type(o) != tensorflow::DT_FLOAT) return false;
  }
  if (n.type_string() == "FusedBatchNormV3") {
    bool training = true;
    if (!tensorflow::TryGetNodeAttr(n.attrs(), "is_training", &training) || training) return false;
    for (const Edge* e : n.out_edges()) {
      if (!e->IsControlEdge() && e->src_output() != 0) return false;  // the statistics: training's
    }
  }
  std::string format;
  if (tensorflow::TryGetNodeAttr(n.attrs(), "data_format", &format) && format != "NHWC") return false;
  return true;
}

// Clusters as sets of node ids, grown by merging along data edges where the
// merge makes no cycle (as XLA's MarkForCompilation does with GraphCycles).
class Clustering {
 public:
  explicit Clustering(const Graph& g) : g_(g), cluster_of_(g.num_node_ids(), -1) {}

  void Add(const Node& n) {
    cluster_of_[n.id()] = n.id();
    members_[n.id()] = {n.id()};
  }

  int ClusterOf(const Node& n) const { return cluster_of_[n.id()]; }

  // Merges the clusters of a and b unless another path joins them: then the
  // merged cluster would both feed and be fed by what lies on that path.
  void TryMerge(const Node& a, const Node& b) {
    const int ca = ClusterOf(a), cb = ClusterOf(b);
    if (ca < 0 || cb < 0 || ca == cb) return;
    if (Reaches(ca, cb, /*skip_direct=*/true) || Reaches(cb, ca, /*skip_direct=*/true)) return;
    std::vector<int>& into = members_[ca];
    for (int id : members_[cb]) {
      cluster_of_[id] = ca;
      into.push_back(id);
    }
    members_.erase(cb);
  }

  const std::map<int, std::vector<int>>& clusters() const { return members_; }

 private:
  // Whether cluster `from` reaches cluster `to` through at least one node
  // outside both (with skip_direct, the edges straight from one to the other
  // are the merge itself). Other clusters count as one node each: a path into
  // one of their nodes goes on from all of them.
  bool Reaches(int from, int to, bool skip_direct) const {
    std::vector<const Node*> stack;
    absl::flat_hash_set<int> seen;  // node ids, and clusters by their key
    auto push_successors = [&](int cluster_or_node, bool is_cluster) {
      const std::vector<int> single = {cluster_or_node};
      const std::vector<int>& ids = is_cluster ? members_.at(cluster_or_node) : single;
      for (int id : ids) {
        const Node* n = g_.FindNodeId(id);
        // A loop's back edge (NextIteration to Merge) joins one iteration to
        // the next, not a node to itself: without it a frame's graph is a DAG,
        // as XLA's cycle check sees it. Else everything in a loop body reaches
        // everything, and nothing there merges.
        if (n->IsNextIteration()) continue;
        for (const Edge* e : n->out_edges()) {
          const Node* dst = e->dst();
          if (!dst->IsOp()) continue;
          const int c = cluster_of_[dst->id()];
          if (c == from) continue;
          if (c == to) {
            if (skip_direct && is_cluster && cluster_or_node == from) continue;
            return true;
          }
          stack.push_back(dst);
        }
      }
      return false;
    };
    if (push_successors(from, true)) return true;
    while (!stack.empty()) {
      const Node* n = stack.back();
      stack.pop_back();
      const int c = cluster_of_[n->id()];
      const int key = c >= 0 ? -1 - c : n->id();  // clusters and nodes apart
      if (!seen.insert(key).second) continue;
      if (push_successors(c >= 0 ? c : n->id(), c >= 0)) return true;
    }
    return false;
  }

  const Graph& g_;
  std::vector<int> cluster_of_;            // by node id: its cluster's key, or -1
  std::map<int, std::vector<int>> members_;  // by key: node ids
};

// One cluster, ready to rewrite: its nodes, the constants it copies, the
// tensors it takes and gives, and its function.
struct Plan {
  std::vector<Node*> nodes;      // in topological order
  std::vector<Node*> constants;  // outside nodes copied into the function
  std::vector<OutputTensor> inputs;
  std::vector<OutputTensor> outputs;
  FunctionDef function;
  std::string id;
  std::string device;
  std::vector<std::string> op_types;
};

std::atomic<int64_t> next_cluster{0};

Status PlanCluster(Graph* g, const std::vector<int>& ids, const std::vector<int>& topo_index,
                   const Naming& naming, Plan* plan) {
  absl::flat_hash_set<int> in_cluster(ids.begin(), ids.end());
  for (int id : ids) plan->nodes.push_back(g->FindNodeId(id));
  std::sort(plan->nodes.begin(), plan->nodes.end(),
            [&](const Node* a, const Node* b) { return topo_index[a->id()] < topo_index[b->id()]; });
  absl::flat_hash_set<std::pair<int, int>> seen_inputs, seen_outputs;
  absl::flat_hash_set<int> seen_constants;
  for (Node* n : plan->nodes) {
    plan->op_types.push_back(n->type_string());
    for (const Edge* e : n->in_edges()) {
      if (e->IsControlEdge() || in_cluster.contains(e->src()->id())) continue;
      if (IsConstant(*e->src())) {
        if (seen_constants.insert(e->src()->id()).second) plan->constants.push_back(e->src());
      } else if (seen_inputs.insert({e->src()->id(), e->src_output()}).second) {
        plan->inputs.emplace_back(e->src(), e->src_output());
      }
    }
    for (const Edge* e : n->out_edges()) {
      if (e->IsControlEdge() || in_cluster.contains(e->dst()->id())) continue;
      if (seen_outputs.insert({n->id(), e->src_output()}).second) plan->outputs.emplace_back(n, e->src_output());
    }
  }
  if (plan->outputs.empty()) return errors::InvalidArgument("the cluster's results are not used");
  // Inputs, outputs and the function's nodes in the order of their names, not
  // of the graph's node ids: the same part of the same model, traced again or
  // in another process, makes the same function, and so hits the same compile
  // cache entry.
  auto by_name = [](const OutputTensor& a, const OutputTensor& b) {
    return std::make_pair(a.node->name(), a.index) < std::make_pair(b.node->name(), b.index);
  };
  std::sort(plan->inputs.begin(), plan->inputs.end(), by_name);
  std::sort(plan->outputs.begin(), plan->outputs.end(), by_name);
  plan->device = plan->nodes.front()->assigned_device_name();
  plan->id = absl::StrCat(naming.prefix, next_cluster.fetch_add(1));
  std::vector<const Node*> body(plan->constants.begin(), plan->constants.end());
  body.insert(body.end(), plan->nodes.begin(), plan->nodes.end());
  std::sort(body.begin(), body.end(), [](const Node* a, const Node* b) { return a->name() < b->name(); });
  std::vector<std::string> output_names;
  for (size_t i = 0; i < plan->outputs.size(); ++i) output_names.push_back(absl::StrCat("output_", i));
  // A constant copied in may hang on a control edge (inside a loop, from the
  // frame's pivot, which puts it in the frame); in the function it needs none,
  // and GraphToFunctionDef refuses control inputs from outside the body: they
  // are taken off for it and put back after.
  std::vector<std::pair<Node*, Node*>> detached;
  for (Node* c : plan->constants) {
    std::vector<const Edge*> controls;
    for (const Edge* e : c->in_edges()) {
      if (e->IsControlEdge() && !e->src()->IsSource()) controls.push_back(e);
    }
    for (const Edge* e : controls) {
      detached.emplace_back(e->src(), c);
      g->RemoveControlEdge(e);
    }
  }
  const Status made = tensorflow::GraphToFunctionDef(
      *g, absl::StrCat("__", plan->id), /*append_hash_to_fn_name=*/naming.hashed, /*set_stateful_from_nodes=*/false,
      /*copy_placeholder_attrs_from_nodes=*/false, body, plan->inputs, plan->outputs, output_names, {}, {},
      "a part of a graph tf_op.auto compiles with TVM", &plan->function);
  for (const auto& [src, dst] : detached) g->AddControlEdge(src, dst, /*allow_duplicates=*/true);
  TF_RETURN_IF_ERROR(made);
  if (naming.hashed) plan->id = plan->function.signature().name().substr(2);
  (*plan->function.mutable_attr())[kClusterFunctionAttr].set_b(true);
  // Marked node by node as well: should TF ever optimise the function's graph
  // without saying whose it is, its nodes still refuse a cluster of their own.
  for (tensorflow::NodeDef& node : *plan->function.mutable_node_def()) {
    (*node.mutable_attr())[kClusterFunctionAttr].set_b(true);
  }
  return Status();
}

// Replaces the plan's nodes with one TVMDSOOpCluster: the node is made first
// (the one step that can fail), then the edges move and the nodes go.
Status Rewrite(Graph* g, const Plan& plan, const std::string& node_name) {
  std::vector<NodeBuilder::NodeOut> inputs;
  tensorflow::DataTypeVector in_types, out_types;
  for (const OutputTensor& t : plan.inputs) {
    inputs.emplace_back(t.node, t.index);
    in_types.push_back(t.node->output_type(t.index));
  }
  for (const OutputTensor& t : plan.outputs) out_types.push_back(t.node->output_type(t.index));
  NameAttrList function;
  function.set_name(plan.function.signature().name());
  Node* cluster = nullptr;
  TF_RETURN_IF_ERROR(NodeBuilder(node_name.empty() ? g->NewName(plan.id) : node_name, "TVMDSOOpCluster")
                         .Input(inputs)
                         .Input(std::vector<NodeBuilder::NodeOut>{})  // libraries: none compiled ahead
                         .Attr("Tin", in_types)
                         .Attr("Tout", out_types)
                         .Attr("function", function)
                         .Attr("cluster", plan.id)
                         .Device(plan.nodes.front()->requested_device())
                         .Finalize(g, &cluster));
  cluster->set_assigned_device_name(plan.device);
  for (size_t i = 0; i < plan.outputs.size(); ++i) {
    const OutputTensor& out = plan.outputs[i];
    std::vector<const Edge*> moving;
    for (const Edge* e : out.node->out_edges()) {
      if (!e->IsControlEdge() && e->src_output() == out.index &&
          std::find(plan.nodes.begin(), plan.nodes.end(), e->dst()) == plan.nodes.end()) {
        moving.push_back(e);
      }
    }
    for (const Edge* e : moving) {
      Node* dst = e->dst();
      const int dst_input = e->dst_input();
      g->RemoveEdge(e);
      g->AddEdge(cluster, static_cast<int>(i), dst, dst_input);
    }
  }
  // The nodes' control edges with the rest of the graph become the cluster's
  // (a loop's: auto_loop_pass.cc; the ops auto_pass.cc clusters have none).
  absl::flat_hash_set<const Node*> members(plan.nodes.begin(), plan.nodes.end());
  absl::flat_hash_set<Node*> before, after;
  for (Node* n : plan.nodes) {
    for (const Edge* e : n->in_edges()) {
      if (e->IsControlEdge() && !e->src()->IsSource() && !members.contains(e->src())) before.insert(e->src());
    }
    for (const Edge* e : n->out_edges()) {
      if (e->IsControlEdge() && !e->dst()->IsSink() && !members.contains(e->dst())) after.insert(e->dst());
    }
  }
  for (Node* n : before) g->AddControlEdge(n, cluster);
  for (Node* n : after) g->AddControlEdge(cluster, n);
  for (Node* n : plan.nodes) g->RemoveNode(n);
  tensorflow::FixupSourceAndSinkEdges(g);
  return Status();
}

}  // namespace

bool ClaimedElsewhere(const Node& n) {
  for (const char* attr : {"_XlaCompile", "_XlaScope", "_XlaMustCompile", "_xla_compile_id", kClusterFunctionAttr}) {
    if (n.attrs().Find(attr) != nullptr) return true;
  }
  return false;
}

Status Encapsulate(Graph* g, tensorflow::FunctionLibraryDefinition* flib, const std::vector<int>& ids,
                   const std::vector<int>& topo_index, const Naming& naming, const std::string& graph_name,
                   const std::string& node_name) {
  Plan plan;
  Status planned = PlanCluster(g, ids, topo_index, naming, &plan);
  if (planned.ok()) planned = flib->AddFunctionDef(plan.function);
  if (planned.ok()) planned = Rewrite(g, plan, node_name);
  const std::string ops = absl::StrJoin(plan.op_types, ",");
  VLOG(1) << "tf_op.auto: " << graph_name << ": " << plan.id << " of " << plan.nodes.size() << " ops (" << ops
          << "): " << (planned.ok() ? "made" : planned.ToString());
  const std::string reason = planned.ok() ? "" : std::string(planned.message());
  tvmdsoopAutoClusterMade(const_cast<char*>(plan.id.c_str()), const_cast<char*>(graph_name.c_str()),
                          const_cast<char*>(ops.c_str()), const_cast<char*>(reason.c_str()));
  return planned;
}

namespace {

// Clusters g (a function's graph, graph_name, or a session's) in place: each
// cluster's function goes into flib, and the report hears of each cluster.
void ClusterGraph(Graph* g, tensorflow::FunctionLibraryDefinition* flib, const std::string& graph_name,
                  int min_cluster_size, const Naming& naming) {
  std::vector<Node*> order;
  tensorflow::GetReversePostOrder(*g, &order);
  std::vector<int> topo_index(g->num_node_ids(), 0);
  for (size_t i = 0; i < order.size(); ++i) topo_index[order[i]->id()] = static_cast<int>(i);

  Clustering clustering(*g);
  for (Node* n : order) {
    if (Clusterable(*n)) clustering.Add(*n);
  }
  for (Node* n : order) {
    if (clustering.ClusterOf(*n) < 0) continue;
    for (const Edge* e : n->in_edges()) {
      if (!e->IsControlEdge() && clustering.ClusterOf(*e->src()) >= 0 &&
          e->src()->assigned_device_name() == n->assigned_device_name()) {
        clustering.TryMerge(*e->src(), *n);
      }
    }
  }

  for (const auto& [key, ids] : clustering.clusters()) {
    int anchors = 0, size = 0;
    for (int id : ids) {
      const Node* n = g->FindNodeId(id);
      if (n->type_string() == "Identity") continue;
      ++size;
      anchors += SupportedOps().at(n->type_string()) == Role::kAnchor ? 1 : 0;
    }
    if (anchors == 0 || size < min_cluster_size) continue;
    Encapsulate(g, flib, ids, topo_index, naming, graph_name).IgnoreError();  // reported
  }
}

// Whether f says so of itself (attr `name`, a bool, true).
bool FunctionAttrTrue(const FunctionDef* f, const char* name) {
  if (f == nullptr) return false;
  auto it = f->attr().find(name);
  return it != f->attr().end() && it->second.b();
}

class AutoClusterPass : public AutoPass {
 public:
  AutoClusterPass() : AutoPass(ClusterGraph) {}
};

}  // namespace

Status AutoPass::Run(const GraphOptimizationPassOptions& options) {
  const TvmdsoopAutoSettings settings = tvmdsoop_auto_settings_get();
  if (!settings.enabled || options.graph == nullptr || options.flib_def == nullptr) return Status();
  if (FunctionAttrTrue(options.function_def, kClusterFunctionAttr) ||
      FunctionAttrTrue(options.function_def, "_XlaMustCompile")) {
    return Status();
  }
  const std::string graph_name = options.function_def != nullptr ? options.function_def->signature().name()
                                                                  : std::string("a session's graph");
  cluster_(options.graph->get(), options.flib_def, graph_name, settings.min_cluster_size, Naming());
  return Status();
}

// Ahead of XLA's passes (its clustering runs at phase 10 of this grouping).
REGISTER_OPTIMIZATION(::tensorflow::OptimizationPassRegistry::POST_REWRITE_FOR_EXEC, 4, AutoClusterPass);

}  // namespace tvmdsoop

// tf_op.auto.convert's clustering: the pass's, on a GraphDef (size bytes at
// data) that TF has not placed, every node on the CPU. It returns the GraphDef
// with its clusters (malloc'ed, *out_size bytes), or NULL and a malloc'ed
// *error. The clusters are named with hashes (Naming), and reported as the
// pass's are.
extern "C" __attribute__((visibility("default"))) char* TVMDSOOpAutoClusterGraphDef(const char* data, size_t size,
                                                                                    int min_cluster_size,
                                                                                    size_t* out_size,
                                                                                    char** error) {
  *error = nullptr;
  auto fail = [error](const std::string& message) -> char* {
    *error = strdup(absl::StrCat("tf_op.auto.convert: ", message).c_str());
    return nullptr;
  };
  tensorflow::GraphDef graph_def;
  if (!graph_def.ParseFromArray(data, static_cast<int>(size))) return fail("the GraphDef does not parse");
  tensorflow::FunctionLibraryDefinition flib(tensorflow::OpRegistry::Global(), graph_def.library());
  tensorflow::Graph g(flib);
  tensorflow::GraphConstructorOptions options;
  options.allow_internal_ops = true;
  const tensorflow::Status status = tensorflow::ConvertGraphDefToGraph(options, std::move(graph_def), &g);
  if (!status.ok()) return fail(std::string(status.message()));
  // Placed on the CPU to be clustered, and unplaced again after: the GraphDef
  // keeps the devices it asked for, no more.
  tvmdsoop::ClusterLoops(&g, g.mutable_flib_def(), "tf_op.auto.convert", min_cluster_size,
                         tvmdsoop::Naming{"tvmdsoop_convert_", /*hashed=*/true});
  constexpr char kCPU[] = "/job:localhost/replica:0/task:0/device:CPU:0";
  for (tensorflow::Node* n : g.op_nodes()) n->set_assigned_device_name(kCPU);
  tvmdsoop::ClusterGraph(&g, g.mutable_flib_def(), "tf_op.auto.convert", min_cluster_size,
                         tvmdsoop::Naming{"tvmdsoop_convert_", /*hashed=*/true});
  for (tensorflow::Node* n : g.op_nodes()) n->set_assigned_device_name("");
  tensorflow::GraphDef clustered;
  g.ToGraphDef(&clustered);
  std::string bytes;
  if (!clustered.SerializeToString(&bytes)) return fail("the clustered GraphDef does not serialize");
  char* out = static_cast<char*>(std::malloc(bytes.size()));
  if (out == nullptr) return fail("out of memory");
  std::memcpy(out, bytes.data(), bytes.size());
  *out_size = bytes.size();
  return out;
}
