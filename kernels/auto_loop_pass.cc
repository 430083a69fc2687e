// auto_loop_pass.cc: tf_op.auto's pass over loops (docs/auto.md). A
// recurrent layer is a While whose body is a cell: after TF lowers the While
// into a frame (LowerFunctionalOpsPass, early in placement's grouping),
// auto_pass.cc can cluster only the cell, and each step then pays a call into
// TVM and back through TF's executor. Before the lowering, this pass takes the
// whole While, with the tensor lists it reads its steps from and writes them
// to, into one TVMDSOOpCluster: one call runs every step in TVM, and TF's run
// of the cluster's function (when TVM does not) lowers the While as TF would.
//
// The body reads its weights from variables the loop passes along unchanged
// (TF marks them `_read_only_resource_inputs`). A cluster takes values, not
// variables: each is read once, ahead of the loop, and the body and cond are
// copied with the variable's argument turned into its value. As the loop does
// not write them, that reads what each step would read, unless something
// outside the loop writes the variable while it runs (a race in TF too).
//
// A loop this pass cannot take is left as it was, to be lowered and clustered
// by auto_pass.cc step by step.
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/auto_cluster.h"
#include "tensorflow/core/common_runtime/optimization_registry.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/function.pb.h"
#include "tensorflow/core/framework/node_def_util.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"
#include "tensorflow/core/graph/algorithm.h"
#include "tensorflow/core/graph/node_builder.h"
#include "tensorflow/core/platform/logging.h"
#include "tensorflow/core/util/device_name_utils.h"

namespace tvmdsoop {
namespace {

using ::tensorflow::AttrValue;
using ::tensorflow::DataType;
using ::tensorflow::Edge;
using ::tensorflow::FunctionDef;
using ::tensorflow::FunctionLibraryDefinition;
using ::tensorflow::Graph;
using ::tensorflow::Node;
using ::tensorflow::NodeDef;
using ::tensorflow::Status;
namespace errors = ::tensorflow::errors;

// What a loop's cond and body may hold besides the ops clusters take: the
// step's bookkeeping, which TF's TFLite converter turns into its WHILE's
// subgraphs and TVM's frontend converts with them.
const absl::flat_hash_set<std::string>& LoopOps() {
  static const auto* ops = new absl::flat_hash_set<std::string>{
      "Const",     "Identity",   "NoOp",       "Less",        "LessEqual",         "Greater",
      "GreaterEqual", "LogicalAnd", "LogicalOr", "LogicalNot", "TensorListGetItem", "TensorListSetItem",
      "ReadVariableOp", "StridedSlice"};  // a GRU cell slices its bias
// (A TensorListSetItem at each step's own index, a layer's whole sequence, is
// taken: the worker unrolls such a loop, or says why it cannot compile it.)
  return *ops;
}

// Ops that compute a loop's bound or a list's shape from constants: taken into
// the cluster with them, so that TVM sees the numbers.
const absl::flat_hash_set<std::string>& ConstantOps() {
  static const auto* ops = new absl::flat_hash_set<std::string>{
      "Range", "Max", "Min", "Sum", "Prod", "Pack", "Identity", "Add", "AddV2", "Sub", "Mul",
      "Maximum", "Minimum", "Cast", "StridedSlice", "Reshape"};
  return *ops;
}

// Whether n's value follows from constants alone, through at most `depth`
// ops; the nodes on the way (not the constants themselves, which the cluster
// copies) go into `members` when it does.
bool FromConstants(Node* n, int depth, std::set<Node*>* members) {
  std::set<Node*> on_the_way;
  std::vector<std::pair<Node*, int>> stack = {{n, depth}};
  while (!stack.empty()) {
    auto [node, left] = stack.back();
    stack.pop_back();
    if (node->type_string() == "Const") continue;
    if (left == 0 || !ConstantOps().contains(node->type_string())) return false;
    for (const Edge* e : node->in_edges()) {
      if (e->IsControlEdge() && !e->src()->IsSource()) return false;
      if (!e->IsControlEdge()) stack.emplace_back(e->src(), left - 1);
    }
    on_the_way.insert(node);
  }
  members->insert(on_the_way.begin(), on_the_way.end());
  return true;
}

// The function argument (or node output) a FunctionDef input names:
// "x" (an argument), "node:out:0" or "^node" (a control input).
std::string InputNode(const std::string& input) {
  const std::string name = absl::StartsWith(input, "^") ? input.substr(1) : input;
  return name.substr(0, name.find(':'));
}

// The loop's cond or body, checked: ops a cluster can take; variables
// (`resources`, by argument index) only read (ReadVariableOp, whose dtype goes
// into `dtypes`) or passed on (Identity, to the function's results only).
Status CheckLoopFunction(const FunctionDef& f, const std::set<int>& resources, std::map<int, DataType>* dtypes,
                         int* anchors, int* size) {
  std::map<std::string, int> resource_args;
  for (int i : resources) resource_args[f.signature().input_arg(i).name()] = i;
  std::set<std::string> passed_on;  // Identity nodes of a variable
  for (const NodeDef& node : f.node_def()) {
    const std::string& op = node.op();
    const auto supported = SupportedOps().find(op);
    if ((supported == SupportedOps().end() || absl::StartsWith(op, "_")) && !LoopOps().contains(op)) {
      return errors::Unimplemented(f.signature().name(), " holds ", op, " (", node.name(), ")");
    }
    if (supported != SupportedOps().end() && op != "Identity") {
      ++*size;
      if (supported->second == Role::kAnchor) ++*anchors;
    }
    for (int k = 0; k < node.input_size(); ++k) {
      if (absl::StartsWith(node.input(k), "^")) continue;
      const std::string source = InputNode(node.input(k));
      if (passed_on.count(source) > 0) {
        return errors::Unimplemented(f.signature().name(), ": ", node.name(), " takes a variable");
      }
      const auto arg = resource_args.find(node.input(k));
      if (arg == resource_args.end()) {
        if (op == "ReadVariableOp") {
          return errors::Unimplemented(f.signature().name(), ": ", node.name(), " reads a variable the loop writes");
        }
        continue;
      }
      if (op == "ReadVariableOp") {
        const auto dtype = node.attr().find("dtype");
        if (dtype == node.attr().end()) return errors::InvalidArgument(node.name(), " has no dtype");
        (*dtypes)[arg->second] = dtype->second.type();
      } else if (op == "Identity") {
        passed_on.insert(node.name());
      } else {
        return errors::Unimplemented(f.signature().name(), ": ", node.name(), " (", op, ") takes a variable");
      }
    }
  }
  return Status();
}

// f with the variables of `dtypes` (by argument index) as values: each
// ReadVariableOp of one becomes an Identity of its value. `is_body`: f's
// results are the loop's variables too.
FunctionDef WithValues(const FunctionDef& f, const std::map<int, DataType>& dtypes, bool is_body) {
  FunctionDef out = f;
  out.mutable_signature()->set_name(absl::StrCat(f.signature().name(), "_tvmdsoop_values"));
  out.mutable_attr()->erase("_input_shapes");
  std::map<std::string, DataType> by_name;
  for (const auto& [i, dtype] : dtypes) {
    out.mutable_signature()->mutable_input_arg(i)->set_type(dtype);
    if (is_body) out.mutable_signature()->mutable_output_arg(i)->set_type(dtype);
    by_name[f.signature().input_arg(i).name()] = dtype;
    out.mutable_resource_arg_unique_id()->erase(i);
    auto arg_attr = out.mutable_arg_attr()->find(i);
    if (arg_attr != out.mutable_arg_attr()->end()) {
      arg_attr->second.mutable_attr()->erase("_handle_dtypes");
      arg_attr->second.mutable_attr()->erase("_handle_shapes");
    }
  }
  // A ReadVariableOp's result is named "value", an Identity's "output".
  std::map<std::string, std::string> renamed;
  for (NodeDef& node : *out.mutable_node_def()) {
    if (node.input_size() == 0) continue;
    const auto value = by_name.find(node.input(0));
    if (value == by_name.end()) continue;
    if (node.op() == "ReadVariableOp") {
      node.set_op("Identity");
      node.mutable_attr()->erase("dtype");
      renamed[absl::StrCat(node.name(), ":value:")] = absl::StrCat(node.name(), ":output:");
    }
    (*node.mutable_attr())["T"].set_type(value->second);
  }
  auto rename = [&renamed](std::string* input) {
    const size_t colon = input->find(':', input->find(':') + 1);
    if (colon == std::string::npos) return;
    const auto to = renamed.find(input->substr(0, colon + 1));
    if (to != renamed.end()) *input = to->second + input->substr(colon + 1);
  };
  for (NodeDef& node : *out.mutable_node_def()) {
    for (std::string& input : *node.mutable_input()) rename(&input);
  }
  for (auto& [name, input] : *out.mutable_ret()) rename(&input);
  return out;
}

// One loop, checked and ready to rewrite.
struct LoopPlan {
  Node* loop = nullptr;
  FunctionDef cond, body;             // with the variables as values
  std::map<int, DataType> reads;      // the variables, by input index, and their values' dtypes
  std::set<Node*> members;            // what joins the While in the cluster
  int size = 0;                       // the ops of its body a cluster counts
};

Status PlanLoop(Node* loop, const FunctionLibraryDefinition& flib, LoopPlan* plan) {
  plan->loop = loop;
  if (ClaimedElsewhere(*loop)) return errors::Unimplemented("XLA's, or a cluster's");
  tensorflow::DeviceNameUtils::ParsedName device;
  if (!tensorflow::DeviceNameUtils::ParseFullName(loop->requested_device(), &device) ||
      (device.has_type && device.type != "CPU")) {
    return errors::Unimplemented("not on a CPU: ", loop->requested_device());
  }
  tensorflow::NameAttrList cond_attr, body_attr;
  std::vector<DataType> types;
  TF_RETURN_IF_ERROR(tensorflow::GetNodeAttr(loop->attrs(), "cond", &cond_attr));
  TF_RETURN_IF_ERROR(tensorflow::GetNodeAttr(loop->attrs(), "body", &body_attr));
  TF_RETURN_IF_ERROR(tensorflow::GetNodeAttr(loop->attrs(), "T", &types));
  std::vector<int> read_only;
  if (!tensorflow::TryGetNodeAttr(loop->attrs(), "_read_only_resource_inputs", &read_only)) read_only.clear();
  const FunctionDef* cond = flib.Find(cond_attr.name());
  const FunctionDef* body = flib.Find(body_attr.name());
  if (cond == nullptr || body == nullptr) return errors::NotFound("its cond or body is not in the library");
  const int num_vars = static_cast<int>(types.size());
  if (cond->signature().input_arg_size() != num_vars || body->signature().input_arg_size() != num_vars ||
      body->signature().output_arg_size() != num_vars) {
    return errors::InvalidArgument("its cond or body does not take its ", num_vars, " loop variables");
  }

  std::vector<const Edge*> inputs;
  TF_RETURN_IF_ERROR(loop->input_edges(&inputs));
  std::set<int> resources;
  for (int i = 0; i < num_vars; ++i) {
    Node* src = inputs[i]->src();
    std::vector<const Edge*> uses;
    for (const Edge* e : loop->out_edges()) {
      if (!e->IsControlEdge() && e->src_output() == i) uses.push_back(e);
    }
    switch (types[i]) {
      case tensorflow::DT_FLOAT:
      case tensorflow::DT_INT32:
      case tensorflow::DT_BOOL:
        FromConstants(src, 8, &plan->members);
        break;
      case tensorflow::DT_RESOURCE:
        if (std::find(read_only.begin(), read_only.end(), i) == read_only.end() || !uses.empty()) {
          return errors::Unimplemented("loop variable ", i, " is a variable the loop may write");
        }
        resources.insert(i);
        break;
      case tensorflow::DT_VARIANT: {
        // A tensor list made for the loop alone (the steps it reads, or the
        // results it writes) and read only by stacking it back into a tensor.
        const std::string& made_by = src->type_string();
        if (made_by != "TensorListReserve" && made_by != "TensorListFromTensor") {
          return errors::Unimplemented("loop variable ", i, " is a ", made_by);
        }
        for (const Edge* e : src->out_edges()) {
          if (e->dst() != loop) return errors::Unimplemented("loop variable ", i, "'s list has other readers");
        }
        for (const Edge* e : src->in_edges()) {
          if (e->IsControlEdge()) return errors::Unimplemented("loop variable ", i, "'s list waits on control");
          // The element shape and length: constants; a list's tensor: an input.
          const bool is_tensor = made_by == "TensorListFromTensor" && e->dst_input() == 0;
          if (!is_tensor && !FromConstants(e->src(), 8, &plan->members)) {
            return errors::Unimplemented("loop variable ", i, "'s list has a shape that is not constant");
          }
        }
        plan->members.insert(src);
        for (const Edge* e : uses) {
          Node* reader = e->dst();
          if (reader->type_string() != "TensorListStack") {
            return errors::Unimplemented("loop result ", i, " is read by ", reader->type_string());
          }
          for (const Edge* r : reader->in_edges()) {
            if (r->IsControlEdge() || (r->dst_input() == 1 && !FromConstants(r->src(), 8, &plan->members))) {
              return errors::Unimplemented("loop result ", i, " is stacked to a shape that is not constant");
            }
          }
          plan->members.insert(reader);
        }
        break;
      }
      default:
        return errors::Unimplemented("loop variable ", i, " is a ", tensorflow::DataTypeString(types[i]));
    }
  }
  int anchors = 0, cond_size = 0;
  TF_RETURN_IF_ERROR(CheckLoopFunction(*cond, resources, &plan->reads, &anchors, &cond_size));
  TF_RETURN_IF_ERROR(CheckLoopFunction(*body, resources, &plan->reads, &anchors, &plan->size));
  if (anchors == 0) return errors::Unimplemented("its body has no convolution or matmul");
  for (int i : resources) {
    if (plan->reads.count(i) == 0) return errors::Unimplemented("loop variable ", i, " is a variable it does not read");
  }
  plan->cond = WithValues(*cond, plan->reads, /*is_body=*/false);
  plan->body = WithValues(*body, plan->reads, /*is_body=*/true);
  plan->members.erase(loop);
  return Status();
}

// Puts a While of the plan's functions in place of its loop, its variables
// read ahead of it; returns it. Every check has run: nothing here fails but
// what TF's own graph calls could, and the graph computes what it did.
Status ReplaceLoop(Graph* g, FunctionLibraryDefinition* flib, const LoopPlan& plan, Node** replaced) {
  TF_RETURN_IF_ERROR(flib->AddFunctionDef(plan.cond));
  TF_RETURN_IF_ERROR(flib->AddFunctionDef(plan.body));
  Node* loop = plan.loop;
  std::vector<const Edge*> inputs;
  TF_RETURN_IF_ERROR(loop->input_edges(&inputs));
  std::vector<Node*> waits_on;
  for (const Edge* e : loop->in_edges()) {
    if (e->IsControlEdge() && !e->src()->IsSource()) waits_on.push_back(e->src());
  }
  std::map<int, Node*> reads;
  for (const auto& [i, dtype] : plan.reads) {
    Node* read = nullptr;
    TF_RETURN_IF_ERROR(tensorflow::NodeBuilder(g->NewName(absl::StrCat(loop->name(), "/tvmdsoop_read")),
                                               "ReadVariableOp")
                           .Input(inputs[i]->src(), inputs[i]->src_output())
                           .Attr("dtype", dtype)
                           .ControlInputs(waits_on)
                           .Finalize(g, &read));
    reads[i] = read;
  }
  NodeDef def = loop->def();
  def.set_name(g->NewName(loop->name()));
  def.clear_input();
  auto* attrs = def.mutable_attr();
  attrs->erase("_read_only_resource_inputs");
  (*attrs)["cond"].mutable_func()->set_name(plan.cond.signature().name());
  (*attrs)["body"].mutable_func()->set_name(plan.body.signature().name());
  for (const auto& [i, dtype] : plan.reads) {
    (*attrs)["T"].mutable_list()->set_type(i, dtype);
    const auto shapes = attrs->find("output_shapes");
    if (shapes != attrs->end() && shapes->second.list().shape_size() > i) {
      tensorflow::TensorShapeProto* shape = shapes->second.mutable_list()->mutable_shape(i);
      shape->Clear();
      shape->set_unknown_rank(true);
    }
  }
  Status added;
  Node* values_loop = g->AddNode(std::move(def), &added);
  TF_RETURN_IF_ERROR(added);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto read = reads.find(static_cast<int>(i));
    if (read != reads.end()) {
      g->AddEdge(read->second, 0, values_loop, static_cast<int>(i));
    } else {
      g->AddEdge(inputs[i]->src(), inputs[i]->src_output(), values_loop, static_cast<int>(i));
    }
  }
  for (Node* n : waits_on) g->AddControlEdge(n, values_loop);
  std::vector<const Edge*> outs(loop->out_edges().begin(), loop->out_edges().end());
  for (const Edge* e : outs) {
    if (e->IsControlEdge()) {
      g->AddControlEdge(values_loop, e->dst(), /*allow_duplicates=*/true);
    } else {
      g->AddEdge(values_loop, e->src_output(), e->dst(), e->dst_input());
    }
  }
  g->RemoveNode(loop);
  *replaced = values_loop;
  return Status();
}

class AutoLoopPass : public AutoPass {
 public:
  AutoLoopPass() : AutoPass(ClusterLoops) {}
};

}  // namespace

void ClusterLoops(Graph* g, FunctionLibraryDefinition* flib, const std::string& graph_name, int min_cluster_size,
                  const Naming& naming) {
  std::vector<Node*> loops;
  for (Node* n : g->op_nodes()) {
    if (n->type_string() == "While" || n->type_string() == "StatelessWhile") loops.push_back(n);
  }
  for (Node* loop : loops) {
    LoopPlan plan;
    Status status = PlanLoop(loop, *flib, &plan);
    if (status.ok() && plan.size + static_cast<int>(plan.members.size()) < min_cluster_size) {
      status = errors::Unimplemented("smaller than min_cluster_size");
    }
    Node* values_loop = nullptr;
    const std::string loop_name = loop->name();
    if (status.ok()) status = ReplaceLoop(g, flib, plan, &values_loop);
    if (!status.ok()) {
      VLOG(1) << "tf_op.auto: " << graph_name << ": the loop " << loop_name << " stays TF's: " << status;
      continue;
    }
    std::vector<Node*> order;
    tensorflow::GetReversePostOrder(*g, &order);
    std::vector<int> topo_index(g->num_node_ids(), 0);
    for (size_t i = 0; i < order.size(); ++i) topo_index[order[i]->id()] = static_cast<int>(i);
    std::vector<int> ids = {values_loop->id()};
    for (Node* n : plan.members) ids.push_back(n->id());
    // Reported either way; a loop that is not clustered runs as TF would. The
    // cluster takes the loop's name: a function's control outputs name the
    // While (it reads variables), and must find what replaced it.
    Encapsulate(g, flib, ids, topo_index, naming, graph_name, loop_name).IgnoreError();
  }
}

// Before TF lowers functional loops (LowerFunctionalOpsPass, at 10 of this grouping).
REGISTER_OPTIMIZATION(::tensorflow::OptimizationPassRegistry::PRE_PLACEMENT, 5, AutoLoopPass);

}  // namespace tvmdsoop
