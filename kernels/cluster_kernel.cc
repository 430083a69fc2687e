// cluster_kernel.cc: the kernel of TVMDSOOpCluster, the op tf_op.auto's pass
// (auto_pass.cc) puts in place of a part of a graph. Per input shape it
// compiles the part with TVM (Go runs the compiler's process) at the shape's
// first call, times it against TF's run of the part on the next calls, and then
// runs the faster: TVM's code, called as TVMDSOOp calls a model, or the part's
// function through TF's function runtime. Whatever fails on the way (the
// compile, loading what it made, TVM's code failing at run time) sends the
// shape to TF, with the reason in tf_op.auto.report(): a cluster never fails
// the user's step for TVM's sake.
//
// A cluster of a converted SavedModel (tf_op.auto.convert) also holds
// libraries compiled ahead for some input shapes (its `libraries` inputs, as
// assets): those shapes load their library, verified, and run it without a
// compiler, whether or not the pass is on; its other shapes are any cluster's.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/auto_settings.h"
#include "kernels/call.h"
#include "kernels/placement.h"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/framework/function.pb.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/lib/strings/proto_serialization.h"

namespace tvmdsoop {
namespace {

using ::tensorflow::AsyncOpKernel;
using ::tensorflow::FunctionLibraryRuntime;
using ::tensorflow::NameAttrList;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::PartialTensorShape;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using internal::CallReturningFunctionStatus;
using internal::CpuPlacement;
using internal::Resolved;
namespace errors = ::tensorflow::errors;
using Clock = std::chrono::steady_clock;

// Runs of each engine a shape's timing takes, after one run of each to warm up.
constexpr int kTimedRuns = 5;
// The alignment of what TVM's compiled models are handed (TVMDSOOp's default).
constexpr int64_t kAlignment = 64;
// How the report's reason starts when a compile fails.
constexpr char kCompileFailed[] = "the compile failed: ";
// How it starts when TVM's code fails for a call.
constexpr char kRunFailed[] = "TVM's code failed at run time: ";

// One input shape signature of a cluster, and what runs it.
struct Shape {
  enum class State { kNew, kCompiling, kTiming, kTVM, kTF };

  Shape(std::string c, absl::InlinedVector<int64_t, 16> k, std::string text)
      : cluster(std::move(c)), key(std::move(k)), name(std::move(text)) {}
  // The last of the kernel and its compiles in flight lets the shape go, and
  // with it what it loaded.
  ~Shape() {
    if (fn != nullptr) internal::Release(fn);
  }
  Shape(const Shape&) = delete;
  Shape& operator=(const Shape&) = delete;

  // Whether the inputs of this call have this shape.
  bool Matches(const OpKernelContext& ctx, int num_args) const {
    size_t k = 0;
    for (int i = 0; i < num_args; ++i) {
      const Tensor& t = ctx.input(i);
      if (k >= key.size() || key[k++] != t.dims()) return false;
      for (int d = 0; d < t.dims(); ++d) {
        if (k >= key.size() || key[k++] != t.dim_size(d)) return false;
      }
    }
    return k == key.size();
  }

  const std::string cluster;                    // its cluster's name in the report
  const absl::InlinedVector<int64_t, 16> key;  // each input's rank, then its dimensions
  const std::string name;                      // "[1,224,224,3] [64]", for the report
  int ahead = -1;  // the index of its library compiled ahead, if it has one; set before it is shared
  std::mutex mu;
  bool reported_off = false;  // the report heard it ran TF because the pass was off
  std::condition_variable compiled;  // state left kCompiling
  State state = State::kNew;
  const Resolved* fn = nullptr;  // kTiming, kTVM; Shared's, released with the shape
  double compile_seconds = 0;
  std::string library, sha256;  // what fn was loaded from
  int64_t flops = 0;            // the convolutions' and matmuls' in the compiled part, by the compiler's count
  // kTiming: the runs handed out to each engine and the times they took.
  int tf_runs = 0, tvm_runs = 0;
  std::vector<double> tf_seconds, tvm_seconds;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

class ClusterKernel : public AsyncOpKernel {
 public:
  explicit ClusterKernel(OpKernelConstruction* ctx) : AsyncOpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("function", &function_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("cluster", &cluster_));
    int num_libraries = 0;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("Nlib", &num_libraries));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("library_sha256", &library_sha256_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("library_shapes", &library_shapes_));
    OP_REQUIRES(ctx,
                static_cast<int>(library_sha256_.size()) == num_libraries &&
                    static_cast<int>(library_shapes_.size()) == num_libraries,
                errors::InvalidArgument("TVMDSOOpCluster ", cluster_, ": ", num_libraries,
                                        " libraries, but library_sha256 has ", library_sha256_.size(),
                                        " entries and library_shapes ", library_shapes_.size()));
    num_args_ = num_inputs() - num_libraries;
    // What the model returns is checked for count and dtype; its shapes are
    // whatever the part gives for these inputs.
    declared_.resize(num_outputs());
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const bool enabled = tvmdsoop_auto_enabled() != 0;
    // The shape that last ran TVM's code, found without a lock: a graph called
    // with the same shapes step after step pays for no more than this.
    Shape* latest = latest_tvm_.load(std::memory_order_acquire);
    if (latest != nullptr && (enabled || latest->ahead >= 0) && latest->Matches(*ctx, num_args_)) {
      if (RunTVM(ctx, latest, *latest->fn, done)) done();
      return;
    }
    if (!enabled && library_shapes_.empty()) {  // tf_op.auto.disable(): clusters run as TF would
      RunTF(ctx, std::move(done), nullptr);
      return;
    }
    const TvmdsoopAutoSettings settings = tvmdsoop_auto_settings_get();
    std::shared_ptr<Shape> shape = ShapeOf(ctx, settings);
    std::unique_lock<std::mutex> lock(shape->mu);
    // Off, only what was compiled ahead runs TVM's code; the report says so
    // once, of a shape still to compile when the pass is on again.
    if (!enabled && shape->ahead < 0) {
      if (shape->state == Shape::State::kNew && !shape->reported_off) {
        shape->reported_off = true;
        Report(*shape, "tf", "no library was compiled ahead for this shape, and tf_op.auto is off to compile one");
      }
      lock.unlock();
      RunTF(ctx, std::move(done), nullptr);
      return;
    }
    if (shape->state == Shape::State::kNew && shape->ahead >= 0) {
      shape->state = Shape::State::kCompiling;
      lock.unlock();
      LoadAhead(ctx, shape);
      lock.lock();
    }
    if (shape->state == Shape::State::kNew) {
      shape->state = Shape::State::kCompiling;
      if (!settings.wait) {
        lock.unlock();
        StartCompile(ctx, shape, settings);
        RunTF(ctx, std::move(done), nullptr);
        return;
      }
      lock.unlock();
      Compile(ctx, shape, settings);
      lock.lock();
    }
    if (shape->state == Shape::State::kCompiling) {
      if (!settings.wait) {
        lock.unlock();
        RunTF(ctx, std::move(done), nullptr);
        return;
      }
      shape->compiled.wait(lock, [&] { return shape->state != Shape::State::kCompiling; });
    }
    switch (shape->state) {
      case Shape::State::kTVM: {
        const Resolved* fn = shape->fn;
        // Under the lock, so that a shape TVMFailed sends to TF while this call
        // runs does not come back to the fast path.
        latest_tvm_.store(shape.get(), std::memory_order_release);
        lock.unlock();
        if (RunTVM(ctx, shape.get(), *fn, done)) done();
        return;
      }
      case Shape::State::kTiming: {
        // TF and TVM in turns, so that what else loads the machine weighs on
        // both alike; a call beyond those handed out runs TF until the last
        // timed run decides.
        if (shape->tf_runs <= kTimedRuns && shape->tf_runs <= shape->tvm_runs) {
          ++shape->tf_runs;
          lock.unlock();
          RunTF(ctx, std::move(done), shape);
          return;
        }
        if (shape->tvm_runs <= kTimedRuns) {
          ++shape->tvm_runs;
          const Resolved* fn = shape->fn;
          lock.unlock();
          const Clock::time_point start = Clock::now();
          if (RunTVM(ctx, shape.get(), *fn, done)) {
            Timed(shape, /*tvm=*/true, std::chrono::duration<double>(Clock::now() - start).count());
            done();
          }
          return;
        }
        lock.unlock();
        RunTF(ctx, std::move(done), nullptr);
        return;
      }
      default:
        lock.unlock();
        RunTF(ctx, std::move(done), nullptr);
        return;
    }
  }

 private:
  // The shape of this call's inputs, found or made. Past max_shapes a new
  // shape is not compiled: a cluster whose shapes keep changing runs TF.
  // Shapes compiled ahead do not count against max_shapes.
  std::shared_ptr<Shape> ShapeOf(OpKernelContext* ctx, const TvmdsoopAutoSettings& settings) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::shared_ptr<Shape>& s : shapes_) {
      if (s->Matches(*ctx, num_args_)) return s;
    }
    absl::InlinedVector<int64_t, 16> key;
    std::vector<std::string> dims;
    for (int i = 0; i < num_args_; ++i) {
      const Tensor& t = ctx->input(i);
      key.push_back(t.dims());
      for (int d = 0; d < t.dims(); ++d) key.push_back(t.dim_size(d));
      dims.push_back(t.shape().DebugString());
    }
    auto shape = std::make_shared<Shape>(cluster_, key, absl::StrJoin(dims, " "));
    const auto ahead = std::find(library_shapes_.begin(), library_shapes_.end(), shape->name);
    if (ahead != library_shapes_.end()) {
      shape->ahead = static_cast<int>(ahead - library_shapes_.begin());
    } else if (++compiled_shapes_ > settings.max_shapes) {
      shape->state = Shape::State::kTF;
      Report(*shape, "tf", absl::StrCat("more than ", settings.max_shapes,
                                        " input shapes (max_shapes): new shapes run in TF"));
    }
    shapes_.push_back(shape);
    return shape;
  }

  // The compile request: the part's function (a FunctionDefLibrary: the
  // part's function first, then those it calls, as a loop's cond and body, by
  // name) and the inputs' dtypes and shapes.
  Status Request(OpKernelContext* ctx, std::string* function, std::string* inputs) {
    FunctionLibraryRuntime* lib = ctx->function_library();
    if (lib == nullptr) return errors::Internal("no function library to read the cluster's function from");
    const tensorflow::FunctionLibraryDefinition* flib = lib->GetFunctionLibraryDefinition();
    const tensorflow::FunctionDef* fdef = flib->Find(function_.name());
    if (fdef == nullptr) return errors::NotFound("the cluster's function ", function_.name(), " is not in the graph's library");
    tensorflow::FunctionDefLibrary request;
    *request.add_function() = *fdef;
    const tensorflow::FunctionDefLibrary called = flib->ReachableDefinitions(*fdef).ToProto();
    std::vector<const tensorflow::FunctionDef*> by_name;
    for (const tensorflow::FunctionDef& f : called.function()) {
      if (f.signature().name() != function_.name()) by_name.push_back(&f);
    }
    std::sort(by_name.begin(), by_name.end(), [](const tensorflow::FunctionDef* a, const tensorflow::FunctionDef* b) {
      return a->signature().name() < b->signature().name();
    });
    for (const tensorflow::FunctionDef* f : by_name) *request.add_function() = *f;
    if (!tsl::SerializeToStringDeterministic(request, function)) {
      return errors::Internal("cannot serialize the cluster's function");
    }
    std::vector<std::string> specs;
    for (int i = 0; i < num_args_; ++i) {
      const Tensor& t = ctx->input(i);
      std::vector<int64_t> dims;
      for (int d = 0; d < t.dims(); ++d) dims.push_back(t.dim_size(d));
      specs.push_back(absl::StrCat("{\"dtype\":", static_cast<int>(t.dtype()), ",\"shape\":[",
                                   absl::StrJoin(dims, ","), "]}"));
    }
    *inputs = absl::StrCat("[", absl::StrJoin(specs, ","), "]");
    return Status();
  }

  // Compiles the shape in the background (wait=False); the thread keeps what
  // it needs, so the kernel may go before it ends.
  void StartCompile(OpKernelContext* ctx, std::shared_ptr<Shape> shape, const TvmdsoopAutoSettings& settings) {
    std::string function, inputs;
    const Status requested = Request(ctx, &function, &inputs);
    if (!requested.ok()) {
      Decide(*shape, Built(), requested, settings.timing_fallback, kCompileFailed);
      return;
    }
    std::thread([shape, function = std::move(function), inputs = std::move(inputs), cluster = cluster_,
                 settings, num_in = num_args_] {
      Built built;
      const Status status = Build(cluster, function, inputs, num_in, &built);
      Decide(*shape, built, status, settings.timing_fallback, kCompileFailed);
    }).detach();
  }

  void Compile(OpKernelContext* ctx, const std::shared_ptr<Shape>& shape, const TvmdsoopAutoSettings& settings) {
    std::string function, inputs;
    Status status = Request(ctx, &function, &inputs);
    Built built;
    if (status.ok()) status = Build(cluster_, function, inputs, num_args_, &built);
    Decide(*shape, built, status, settings.timing_fallback, kCompileFailed);
  }

  // Loads the shape's library compiled ahead, from the path its `libraries`
  // input gives (the SavedModel's asset): it runs TVM's code from then on, as
  // it was timed against TF when it was compiled.
  void LoadAhead(OpKernelContext* ctx, const std::shared_ptr<Shape>& shape) {
    const Tensor& path = ctx->input(num_args_ + shape->ahead);
    Built built;
    Status status = errors::InvalidArgument("TVMDSOOpCluster ", cluster_, ": library ", shape->ahead,
                                            " must be a scalar string (a path), got a ",
                                            tensorflow::DataTypeString(path.dtype()), " of shape ",
                                            path.shape().DebugString());
    if (path.dtype() == tensorflow::DT_STRING && path.dims() == 0) {
      built.library = std::string(path.scalar<tensorflow::tstring>()());
      built.sha256 = library_sha256_[shape->ahead];
      status = Load(cluster_, num_args_, &built);
    }
    Decide(*shape, built, status, /*timed=*/false, "its library compiled ahead does not load: ");
  }

  // What a compile made: the library, and the function loaded from it.
  struct Built {
    std::string library, sha256;
    int64_t flops = 0;
    double seconds = 0;
    const Resolved* fn = nullptr;
  };

  // Has Go compile the part (or find it in the cache) and load the library.
  static Status Build(const std::string& cluster, const std::string& function, const std::string& inputs,
                      int num_in, Built* built) {
    const Clock::time_point start = Clock::now();
    char* lib_path = nullptr;
    char* sha256 = nullptr;
    char* message = nullptr;
    long long flops = 0;  // NOLINT(runtime/int): cgo's type for C.longlong
    const int code = tvmdsoopAutoCompile(const_cast<char*>(cluster.c_str()),
                                         const_cast<char*>(function.data()), function.size(),
                                         const_cast<char*>(inputs.c_str()), &lib_path, &sha256, &flops, &message);
    built->seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::unique_ptr<char, decltype(&std::free)> path_owner(lib_path, std::free),
        sha_owner(sha256, std::free), message_owner(message, std::free);
    if (code != 0) return Status(static_cast<absl::StatusCode>(code), message ? message : "unknown error");
    built->library = lib_path;
    built->sha256 = sha256;
    built->flops = flops;
    return Load(cluster, num_in, built);
  }

  // Loads built's library, verified against its sha256, and resolves its model's main.
  static Status Load(const std::string& cluster, int num_in, Built* built) {
    auto r = std::make_unique<Resolved>();
    r->lib_path = built->library;
    r->where = absl::StrCat("TVMDSOOpCluster ", cluster, ": function 'main' of ", r->lib_path);
    char* resolve_message = nullptr;
    const int resolved = tvmdsoopResolve(const_cast<char*>(built->library.c_str()), const_cast<char*>("main"),
                                         const_cast<char*>(built->sha256.c_str()), /*graph=*/nullptr, kDLCPU, 0,
                                         /*allowModels=*/1, &r->target, &resolve_message);
    std::unique_ptr<char, decltype(&std::free)> resolve_owner(resolve_message, std::free);
    if (resolved != 0) {
      return Status(static_cast<absl::StatusCode>(resolved),
                    absl::StrCat(r->where, ": ", resolve_message ? resolve_message : "unknown error"));
    }
    if (r->target.pool == nullptr || r->target.arity != num_in) {
      tvmdsoopRelease(r->target.holder);
      return errors::InvalidArgument(r->where, ": expected a model whose main takes ", num_in, " input(s)");
    }
    built->fn = internal::Shared(std::move(r));
    return Status();
  }

  // What a compile (or the load of a library compiled ahead) ends in: timing
  // against TF when `timed`, TVM, or TF with the reason after `failed`.
  static void Decide(Shape& shape, const Built& built, const Status& status, bool timed, const char* failed) {
    std::lock_guard<std::mutex> lock(shape.mu);
    shape.compile_seconds = built.seconds;
    shape.library = built.library;
    shape.sha256 = built.sha256;
    shape.flops = built.flops;
    if (!status.ok()) {
      shape.state = Shape::State::kTF;
      Report(shape, "tf", absl::StrCat(failed, status.message()));
    } else {
      shape.fn = built.fn;
      shape.state = timed ? Shape::State::kTiming : Shape::State::kTVM;
      Report(shape, timed ? "timing" : "tvm", "");
    }
    shape.compiled.notify_all();
  }

  // Records one timed run; the last of them decides which engine keeps the shape.
  static void Timed(const std::shared_ptr<Shape>& shape, bool by_tvm, double seconds) {
    std::lock_guard<std::mutex> lock(shape->mu);
    (by_tvm ? shape->tvm_seconds : shape->tf_seconds).push_back(seconds);
    const size_t wanted = kTimedRuns + 1;
    if (shape->state != Shape::State::kTiming || shape->tf_seconds.size() < wanted ||
        shape->tvm_seconds.size() < wanted) {
      return;
    }
    // The first run of each warms up (TF's first run of a function instantiates it).
    const double tf = Median(std::vector<double>(shape->tf_seconds.begin() + 1, shape->tf_seconds.end()));
    const double tvm = Median(std::vector<double>(shape->tvm_seconds.begin() + 1, shape->tvm_seconds.end()));
    if (tvm <= tf) {
      shape->state = Shape::State::kTVM;
      Report(*shape, "tvm", "");
    } else {
      shape->state = Shape::State::kTF;
      Report(*shape, "tf", absl::StrFormat("TVM's code was slower than TF on its first runs: %.3f ms against %.3f "
                                           "ms (enable(timing_fallback=False) keeps it anyway)",
                                           tvm * 1e3, tf * 1e3));
    }
  }

  // Called with shape.mu held, or before the shape is shared.
  static void Report(const Shape& shape, const char* status, const std::string& reason) {
    tvmdsoopAutoShapeEvent(const_cast<char*>(shape.cluster.c_str()), const_cast<char*>(shape.name.c_str()),
                           const_cast<char*>(status), const_cast<char*>(reason.c_str()), shape.compile_seconds,
                           const_cast<char*>(shape.library.c_str()), const_cast<char*>(shape.sha256.c_str()),
                           shape.flops);
  }

  // Runs the shape's TVM code, fn, on this call's inputs: true when it ran,
  // the outputs set and `done` left to the caller. False when it failed: then
  // TVMFailed has taken `done`, and this call runs TF.
  bool RunTVM(OpKernelContext* ctx, Shape* shape, const Resolved& fn, DoneCallback& done) {
    CpuPlacement placement;
    Status status = placement.Init(ctx);
    if (ABSL_PREDICT_TRUE(status.ok())) {
      status = CallReturningFunctionStatus(ctx, placement, fn, num_args_, declared_, kAlignment);
    }
    if (ABSL_PREDICT_TRUE(status.ok())) return true;
    TVMFailed(ctx, shape, status, std::move(done));
    return false;
  }

  // TVM's code failed for this call: the call runs TF instead, and the shape
  // runs TF from now on, the report saying why. Every failure of
  // CallReturningFunctionStatus falls back so (whatever TVM's code raises, the
  // allocation of an input's aligned copy, an input's wrapping for TVM, what
  // it returned failing the checks), as it leaves the outputs unset, but one:
  // TF failing to allocate an output that must be copied once an earlier output
  // is set. TF cannot set an output twice (its set_output CHECK-fails), so that
  // call fails its step; the shape still goes to TF. Out of line: the calls
  // that run TVM's code never come here.
  ABSL_ATTRIBUTE_NOINLINE void TVMFailed(OpKernelContext* ctx, Shape* shape, const Status& status,
                                         DoneCallback done) {
    {
      std::lock_guard<std::mutex> lock(shape->mu);
      if (shape->state != Shape::State::kTF) {
        shape->state = Shape::State::kTF;
        Report(*shape, "tf", absl::StrCat(kRunFailed, status.message()));
      }
      // Under the lock, as the kTVM case stores it: the fast path stops here.
      Shape* expected = shape;
      latest_tvm_.compare_exchange_strong(expected, nullptr, std::memory_order_acq_rel);
    }
    for (int i = 0; i < num_outputs(); ++i) {
      if (ctx->mutable_output(i) != nullptr) {
        ctx->SetStatus(status);
        done();
        return;
      }
    }
    RunTF(ctx, std::move(done), nullptr);
  }

  // Runs the part as TF would have, from its function; timing it for `timed`.
  void RunTF(OpKernelContext* ctx, DoneCallback done, std::shared_ptr<Shape> timed) {
    FunctionLibraryRuntime* lib = ctx->function_library();
    OP_REQUIRES_ASYNC(ctx, lib != nullptr, errors::Internal(cluster_, ": no function library to run it with"),
                      done);
    FunctionLibraryRuntime::Handle handle;
    OP_REQUIRES_OK_ASYNC(ctx, Instantiate(ctx, lib, &handle), done);
    FunctionLibraryRuntime::Options opts;
    opts.rendezvous = ctx->rendezvous();
    opts.cancellation_manager = ctx->cancellation_manager();
    opts.runner = ctx->runner();
    opts.collective_executor = ctx->collective_executor();
    std::vector<Tensor> args;
    args.reserve(num_args_);
    for (int i = 0; i < num_args_; ++i) args.push_back(ctx->input(i));
    auto* rets = new std::vector<Tensor>();
    const Clock::time_point start = Clock::now();
    lib->Run(opts, handle, args, rets,
             [ctx, rets, done = std::move(done), timed = std::move(timed), start](const Status& status) {
               std::unique_ptr<std::vector<Tensor>> owned(rets);
               if (!status.ok()) {
                 ctx->SetStatus(status);
               } else {
                 for (size_t i = 0; i < owned->size(); ++i) ctx->set_output(static_cast<int>(i), (*owned)[i]);
                 if (timed) Timed(timed, /*tvm=*/false, std::chrono::duration<double>(Clock::now() - start).count());
               }
               done();
             });
  }

  // The part's function, instantiated once for each function runtime.
  Status Instantiate(OpKernelContext* ctx, FunctionLibraryRuntime* lib, FunctionLibraryRuntime::Handle* handle) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handles_.find(lib);
    if (it != handles_.end()) {
      *handle = it->second;
      return Status();
    }
    FunctionLibraryRuntime::InstantiateOptions options;
    options.target = ctx->device()->name();
    // As PartitionedCall instantiates a function: through TF's whole pipeline.
    // A graph TF's grappler rewrote expects TF's later passes (with oneDNN, its
    // layout pass gives _FusedDepthwiseConv2dNative a kernel that computes).
    options.is_multi_device_function = true;
    options.input_devices.assign(num_args_, ctx->device()->name());
    TF_RETURN_IF_ERROR(lib->Instantiate(function_.name(), tensorflow::AttrSlice(&function_.attr()), options, handle));
    handles_[lib] = *handle;
    return Status();
  }

  NameAttrList function_;
  std::string cluster_;
  int num_args_ = 0;  // the part's inputs: the op's first; then the libraries compiled ahead
  std::vector<std::string> library_sha256_, library_shapes_;
  std::vector<PartialTensorShape> declared_;  // unknown: any shape
  // The shape that last ran TVM's code; one of shapes_, which lives as long as the kernel.
  std::atomic<Shape*> latest_tvm_{nullptr};
  std::mutex mu_;  // guards shapes_, compiled_shapes_ and handles_
  std::vector<std::shared_ptr<Shape>> shapes_;
  int compiled_shapes_ = 0;  // the shapes not compiled ahead
  std::map<FunctionLibraryRuntime*, FunctionLibraryRuntime::Handle> handles_;
};

}  // namespace

REGISTER_KERNEL_BUILDER(Name("TVMDSOOpCluster").Device(tensorflow::DEVICE_CPU), ClusterKernel);

}  // namespace tvmdsoop
