// parallel.c: the thread pool that runs TVM-compiled parallel loops (see dsoop.h).
//
// A parallel loop of a tvm.compile'd library calls the function its
// __TVMBackendParallelLaunch pointer holds, with a lambda that computes task
// i of n (TVM's codegen splits the loop's range into n even parts). TVM's
// loader fills the pointer with libtvm_runtime.so's launcher, whose workers
// poll for work with sched_yield and whose caller waits for them the same way:
// a 2-row parallel loop called from Python took 1.45 us on two Zen 4 cores,
// 0.64 on this pool (the call's own cost in both), whose launch is one cache
// line written by the caller and read by the workers, which poll with PAUSE. A model makes a launch of each parallel kernel: the
// Keras CNN at batch 1 (six) 11.2 -> 9.7 us a call in TVM's VM, the
// transformer block at batch 1 1.02-1.2 times as fast (the more so on a busy
// host). dsoop_parallel_install points a loaded library's hooks here.
//
// One pool serves the process, sized by TVM_NUM_THREADS as TVM's is (dsoop.c
// sets it to the CPUs the process may use). A launch from a thread that finds
// the pool busy (another TF thread's kernel), or from inside a task, runs its
// tasks on the calling thread alone: concurrent calls share the CPUs rather
// than each waking a pool of its own, as TVM's per-thread pools did.
#define _GNU_SOURCE  // sched_getaffinity
#include "dsoop.h"

#include <dlfcn.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield")
#else
#define cpu_relax() ((void)0)
#endif

// TVM's launch ABI (tvm/runtime/c_backend_api.h), unchanged since TVM 0.6.
typedef struct {
  void* sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

#define MAX_THREADS 256

// How long an idle worker polls with PAUSE before it polls with sched_yield
// (TVM_THREAD_POOL_SPIN_COUNT times, as TVM's workers do) and then sleeps: the
// gaps between one model call's kernels are a few microseconds, and a worker
// that left them asleep costs a futex wake at the next launch. 20 us kept the
// CNN's and the transformer's calls as fast as 50 or 100 did.
#define PAUSE_NS 20000L

// A barrier's state for one launch (TVMBackendParallelBarrier's sync_handle).
typedef struct {
  _Atomic int32_t arrived;
  _Atomic int32_t phase;
} Barrier;

static struct {
  pthread_mutex_t start_mu;  // held while the first launch makes the workers
  // The caller and threads - 1 workers; 0 until the workers are made, read
  // without the lock by every launch.
  _Atomic int threads;
  long spin_count;
  uint32_t first_generation;  // generation when the workers were made
  _Atomic int busy;                // a launch runs on the pool
  _Atomic uint32_t generation;     // bumped by each launch; workers wait for a change
  _Atomic int32_t sleepers;        // workers asleep on generation
  _Atomic int32_t pending;         // workers yet to finish this launch
  // This launch, written before generation is bumped (release) and read by
  // the workers after they see it (acquire).
  FTVMParallelLambda lambda;
  void* cdata;
  int32_t tasks;
  Barrier barrier;
  // The first error a worker's task raised, moved from its thread.
  _Atomic(TVMFFIObjectHandle) error;
  _Atomic int failed;
} pool = {.start_mu = PTHREAD_MUTEX_INITIALIZER};

static __thread int in_task;  // this thread runs a task: a launch from it runs alone

static long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

// Waits for generation to differ from seen; returns the new one.
static uint32_t next_launch(uint32_t seen) {
  long start = now_ns();
  for (unsigned i = 1;; ++i) {
    uint32_t g = atomic_load_explicit(&pool.generation, memory_order_acquire);
    if (g != seen) return g;
    if (i % 64 == 0 && now_ns() - start > PAUSE_NS) break;
    cpu_relax();
  }
  for (long i = 0; i < pool.spin_count; ++i) {
    uint32_t g = atomic_load_explicit(&pool.generation, memory_order_acquire);
    if (g != seen) return g;
    sched_yield();
  }
  atomic_fetch_add(&pool.sleepers, 1);
  uint32_t g;
  while ((g = atomic_load_explicit(&pool.generation, memory_order_acquire)) == seen) {
    syscall(SYS_futex, &pool.generation, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
  }
  atomic_fetch_sub(&pool.sleepers, 1);
  return g;
}

static int run_task(int32_t task) {
  TVMParallelGroupEnv env = {&pool.barrier, pool.tasks};
  return pool.lambda(task, &env, pool.cdata);
}

// Keeps the first error a worker's task raised, for the launching thread.
static void keep_worker_error(void) {
  atomic_store(&pool.failed, 1);
  TVMFFIObjectHandle raised = dsoop_error_move_raised();
  TVMFFIObjectHandle none = NULL;
  if (raised != NULL && !atomic_compare_exchange_strong(&pool.error, &none, raised)) {
    dsoop_object_release(raised);
  }
}

static void* worker(void* arg) {
  int32_t id = (int32_t)(intptr_t)arg;
  in_task = 1;
  // The launch that makes the pool bumps generation after making its workers,
  // maybe before this thread runs: so the value to wait past is read there.
  uint32_t seen = pool.first_generation;
  for (;;) {
    seen = next_launch(seen);
    // Every worker takes part in every launch, those past its tasks too: so
    // none can read a later launch's job as the one it woke for.
    if (id < pool.tasks && run_task(id) != 0) keep_worker_error();
    atomic_fetch_sub_explicit(&pool.pending, 1, memory_order_release);
  }
  return NULL;
}

// The whole number the environment variable name holds, when it is at least least;
// -1 when it is unset or holds anything else.
static long env_number(const char* name, long least) {
  const char* value = getenv(name);
  char* end = NULL;
  long n = value != NULL ? strtol(value, &end, 10) : 0;
  return value == NULL || end == value || *end != '\0' || n < least ? -1 : n;
}

static int configured_threads(void) {
  long n = env_number("TVM_NUM_THREADS", 1);
  if (n < 0) {
    cpu_set_t cpus;
    n = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  }
  return n > MAX_THREADS ? MAX_THREADS : (int)n;
}

static long configured_spin_count(void) {
  long n = env_number("TVM_THREAD_POOL_SPIN_COUNT", 0);
  return n < 0 ? 200 : n;
}

// A fork's child has none of the workers: it starts a pool of its own.
static void forget_pool_in_child(void) {
  pthread_mutex_init(&pool.start_mu, NULL);
  atomic_store(&pool.threads, 0);
  atomic_store(&pool.busy, 0);
  atomic_store(&pool.sleepers, 0);
}

static pthread_once_t at_fork = PTHREAD_ONCE_INIT;
static void watch_forks(void) { pthread_atfork(NULL, NULL, forget_pool_in_child); }

// Polls until *value equals want: with PAUSE at first, then yielding the CPU,
// which a worker of a pool larger than the CPUs may be waiting for.
static void await_value(_Atomic int32_t* value, int32_t want) {
  long start = now_ns();
  for (unsigned i = 1; atomic_load_explicit(value, memory_order_acquire) != want; ++i) {
    if (i % 64 == 0 && now_ns() - start > PAUSE_NS) {
      sched_yield();
    } else {
      cpu_relax();
    }
  }
}

// The number of threads, the workers made at the first launch. Workers that
// cannot be made leave fewer threads, never a failure.
static int pool_threads(void) {
  int threads = atomic_load_explicit(&pool.threads, memory_order_acquire);
  if (threads > 0) return threads;
  pthread_mutex_lock(&pool.start_mu);
  threads = atomic_load_explicit(&pool.threads, memory_order_relaxed);
  if (threads == 0) {
    pthread_once(&at_fork, watch_forks);
    pool.spin_count = configured_spin_count();
    int wanted = configured_threads();
    threads = 1;
    pool.first_generation = atomic_load(&pool.generation);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (int i = 1; i < wanted; ++i) {
      pthread_t thread;
      if (pthread_create(&thread, &attr, worker, (void*)(intptr_t)i) != 0) break;
      threads++;
    }
    pthread_attr_destroy(&attr);
    atomic_store_explicit(&pool.threads, threads, memory_order_release);
  }
  pthread_mutex_unlock(&pool.start_mu);
  return threads;
}

static int run_alone(FTVMParallelLambda lambda, void* cdata) {
  Barrier barrier = {0, 0};
  TVMParallelGroupEnv env = {&barrier, 1};
  int was_in_task = in_task;
  in_task = 1;
  int rc = lambda(0, &env, cdata);
  in_task = was_in_task;
  return rc == 0 ? 0 : -1;
}

// TVMBackendParallelLaunch's signature (tvm/runtime/c_backend_api.h).
static int parallel_launch(FTVMParallelLambda lambda, void* cdata, int num_task) {
  if (num_task == 1 || in_task) return run_alone(lambda, cdata);
  int threads = pool_threads();
  int tasks = num_task <= 0 || num_task > threads ? threads : num_task;
  if (tasks == 1 || atomic_exchange_explicit(&pool.busy, 1, memory_order_acquire)) {
    return run_alone(lambda, cdata);
  }
  pool.lambda = lambda;
  pool.cdata = cdata;
  pool.tasks = tasks;
  atomic_store_explicit(&pool.barrier.arrived, 0, memory_order_relaxed);
  atomic_store_explicit(&pool.failed, 0, memory_order_relaxed);
  atomic_store_explicit(&pool.pending, threads - 1, memory_order_relaxed);
  atomic_fetch_add(&pool.generation, 1);  // seq_cst: ordered before the read of sleepers
  if (atomic_load(&pool.sleepers) > 0) {
    syscall(SYS_futex, &pool.generation, FUTEX_WAKE_PRIVATE, MAX_THREADS, NULL, NULL, 0);
  }
  in_task = 1;
  int rc = run_task(0);
  in_task = 0;
  await_value(&pool.pending, 0);
  TVMFFIObjectHandle error = atomic_exchange(&pool.error, NULL);
  int failed = atomic_load(&pool.failed);
  atomic_store_explicit(&pool.busy, 0, memory_order_release);
  if (error != NULL && rc == 0) dsoop_error_raise(error);  // else this thread's own is raised already
  dsoop_object_release(error);
  return rc != 0 || failed ? -1 : 0;
}

// TVMBackendParallelBarrier's signature (tvm/runtime/c_backend_api.h).
static int parallel_barrier(int task_id, TVMParallelGroupEnv* penv) {
  (void)task_id;
  Barrier* barrier = (Barrier*)penv->sync_handle;
  int32_t phase = atomic_load_explicit(&barrier->phase, memory_order_acquire);
  if (atomic_fetch_add_explicit(&barrier->arrived, 1, memory_order_acq_rel) == penv->num_task - 1) {
    atomic_store_explicit(&barrier->arrived, 0, memory_order_relaxed);
    atomic_store_explicit(&barrier->phase, phase + 1, memory_order_release);
  } else {
    await_value(&barrier->phase, phase + 1);
  }
  return 0;
}

int dsoop_parallel_install(const char* path) {
  const char* choice = getenv(DSOOP_THREAD_POOL_ENV);
  if (choice != NULL && strcmp(choice, "tvm") == 0) return 0;
  void* library = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
  if (library == NULL) return 0;
  int installed = 0;
  static const struct {
    const char* name;
    void* launcher;
  } hooks[] = {{"__TVMBackendParallelLaunch", (void*)parallel_launch},
               {"__TVMBackendParallelBarrier", (void*)parallel_barrier}};
  for (size_t i = 0; i < sizeof(hooks) / sizeof(hooks[0]); ++i) {
    void** pointer = (void**)dlsym(library, hooks[i].name);
    // Filled by TVM's loader: a library without the runtime keeps its NULL
    // (checkContextPointers refuses it), one that never launches has none.
    if (pointer != NULL && __atomic_load_n(pointer, __ATOMIC_ACQUIRE) != NULL) {
      __atomic_store_n(pointer, hooks[i].launcher, __ATOMIC_RELEASE);
      installed++;
    }
  }
  dlclose(library);
  return installed;
}
