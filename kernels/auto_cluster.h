// auto_cluster.h: what tf_op.auto's two passes share. auto_pass.cc clusters a
// graph's ops after placement; auto_loop_pass.cc clusters whole loops before TF
// lowers them into frames. Both end the same way: a set of nodes becomes one
// TVMDSOOpCluster node whose function keeps them (cluster_kernel.cc runs it).
#ifndef TVMDSOOP_KERNELS_AUTO_CLUSTER_H_
#define TVMDSOOP_KERNELS_AUTO_CLUSTER_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/graph/graph.h"

namespace tvmdsoop {

// The attr a cluster's function carries: the passes leave such graphs alone
// (the kernel runs them when TVM does not, and they must stay TF's).
extern const char kClusterFunctionAttr[];

// Which ops a cluster may hold, and which make one worth compiling (anchors).
enum class Role { kAnchor, kMember };
const absl::flat_hash_map<std::string, Role>& SupportedOps();

// How clusters are named: the passes' are numbered in the process; those of a
// graph tf_op.auto.convert saves carry a hash of their function too, so that
// they keep apart from the passes', and from another converted graph's, in any
// process that loads them.
struct Naming {
  std::string prefix = "tvmdsoop_cluster_";
  bool hashed = false;
};

// Whether n is XLA's, one the user pinned for XLA, or a node of a cluster's
// function: not the passes' to cluster.
bool ClaimedElsewhere(const tensorflow::Node& n);

// How each pass clusters a graph (graph_name, for the report) in place, its
// clusters' functions going into flib.
using ClusterFn = void (*)(tensorflow::Graph* g, tensorflow::FunctionLibraryDefinition* flib,
                           const std::string& graph_name, int min_cluster_size, const Naming& naming);

// A pass of tf_op.auto: while it is enabled, runs its ClusterFn on every graph
// TF is about to run, but a cluster's own function (run by its kernel when TVM
// does not) and functions the user gave to XLA, which stay as they are.
class AutoPass : public tensorflow::GraphOptimizationPass {
 public:
  explicit AutoPass(ClusterFn cluster) : cluster_(cluster) {}
  tensorflow::Status Run(const tensorflow::GraphOptimizationPassOptions& options) override;

 private:
  const ClusterFn cluster_;
};

// Replaces the nodes `ids` of g with one TVMDSOOpCluster whose function (added
// to flib) holds them, and tells tf_op.auto.report() of it (as made, or why it
// was not). topo_index orders g's node ids. The node is named node_name
// (a name no node of g has), or after its cluster. On failure g is as it was.
tensorflow::Status Encapsulate(tensorflow::Graph* g, tensorflow::FunctionLibraryDefinition* flib,
                               const std::vector<int>& ids, const std::vector<int>& topo_index,
                               const Naming& naming, const std::string& graph_name,
                               const std::string& node_name = "");

// The clusters of auto_loop_pass.cc, made in g in place (its pass's ClusterFn,
// and tf_op.auto.convert's, which runs both passes' clustering on a GraphDef).
void ClusterLoops(tensorflow::Graph* g, tensorflow::FunctionLibraryDefinition* flib, const std::string& graph_name,
                  int min_cluster_size, const Naming& naming);

}  // namespace tvmdsoop

#endif  // TVMDSOOP_KERNELS_AUTO_CLUSTER_H_
