package dsoop_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
	"github.com/tvmdsoop/tvmdsoop/dsoop"
)

// parallelSource is a library whose functions launch parallel loops as TVM's
// codegen does, through the __TVMBackendParallelLaunch and
// __TVMBackendParallelBarrier pointers TVM's loader fills. Each writes into its
// int32 vector argument out (64 long):
//   - tasks: out[t] counts the runs of task t, out[32 + t] the tasks it was told of;
//   - barrier: each task writes its number, waits at the barrier, then checks
//     that all tasks wrote theirs (out[t] = 1 + every task seen);
//   - nested: task t launches again; out[t] is the inner launch's task count;
//   - fail: the last task raises a ValueError naming itself;
//   - pool: out[0] is 1 when the launcher lives in libtvm_runtime.so (TVM's pool).
const parallelSource = `#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <tvm/ffi/c_api.h>
typedef struct { void* sync_handle; int32_t num_task; } Env;
typedef int (*Lambda)(int, Env*, void*);
void* __TVMBackendParallelLaunch = 0;
void* __TVMBackendParallelBarrier = 0;
static int launch(Lambda f, void* data, int n) {
  return ((int (*)(Lambda, void*, int))__TVMBackendParallelLaunch)(f, data, n);
}
static int32_t* out_of(const TVMFFIAny* args) { return (int32_t*)((const DLTensor*)args[0].v_ptr)->data; }

static int count(int t, Env* env, void* data) {
  int32_t* out = data;
  __atomic_add_fetch(&out[t], 1, __ATOMIC_SEQ_CST);
  out[32 + t] = env->num_task;
  return 0;
}
TVM_FFI_DLL_EXPORT int __tvm_ffi_tasks(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* result) {
  return launch(count, out_of(args), 0);
}

static int meet(int t, Env* env, void* data) {
  int32_t* out = data;
  __atomic_store_n(&out[32 + t], 1, __ATOMIC_SEQ_CST);
  ((int (*)(int, Env*))__TVMBackendParallelBarrier)(t, env);
  int seen = 0;
  for (int i = 0; i < env->num_task; ++i) seen += __atomic_load_n(&out[32 + i], __ATOMIC_SEQ_CST);
  out[t] = 1 + seen;
  return 0;
}
TVM_FFI_DLL_EXPORT int __tvm_ffi_barrier(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* result) {
  return launch(meet, out_of(args), 0);
}

static int inner(int t, Env* env, void* data) { *(int32_t*)data = env->num_task; return 0; }
static int outer(int t, Env* env, void* data) { return launch(inner, (int32_t*)data + t, 0); }
TVM_FFI_DLL_EXPORT int __tvm_ffi_nested(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* result) {
  return launch(outer, out_of(args), 0);
}

static int fail_last(int t, Env* env, void* data) {
  if (t != env->num_task - 1) return 0;
  char message[64];
  snprintf(message, sizeof(message), "task %d of %d failed", t, env->num_task);
  TVMFFIErrorSetRaisedFromCStr("ValueError", message);
  return -1;
}
TVM_FFI_DLL_EXPORT int __tvm_ffi_fail(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* result) {
  return launch(fail_last, out_of(args), 0);
}

TVM_FFI_DLL_EXPORT int __tvm_ffi_pool(void* self, const TVMFFIAny* args, int32_t n, TVMFFIAny* result) {
  Dl_info info;
  out_of(args)[0] = dladdr(__TVMBackendParallelLaunch, &info) != 0 && info.dli_fname != NULL &&
                    strstr(info.dli_fname, "libtvm_runtime") != NULL;
  return 0;
}
`

// callParallel runs the parallel library's function name and returns its vector.
func callParallel(m *dsoop.Module, name string) ([]int32, error) {
	f, err := m.Func(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := make([]int32, 64)
	tensor, err := dlpack.FromSlice(out, 64)
	if err != nil {
		return nil, err
	}
	return out, f.Call(tensor)
}

// ranOnce reports the first task of out (a result of tasks) that did not run
// exactly once, or that ran past the tasks it was told of; -1 if none.
func ranOnce(out []int32) int32 {
	for i := int32(0); i < 32; i++ {
		want := int32(0)
		if i < out[32] {
			want = 1
		}
		if out[i] != want {
			return i
		}
	}
	return -1
}

// TestParallelLoopsRunOnDsoopsPool: a library's parallel loops run on dsoop's
// pool (parallel.c) unless TVMDSOOP_THREAD_POOL=tvm keeps TVM's. On either,
// each of a launch's tasks runs once, told how many there are; on dsoop's, a
// task's error reaches the caller with its kind, at every call.
func TestParallelLoopsRunOnDsoopsPool(t *testing.T) {
	lib := ccLibrary(t, parallelSource)
	for _, tc := range []struct {
		name, setting string
		tvmPool       int32
		// The kind of a task's error, as the caller gets it; "" for TVM's
		// pool, which loses a worker's error now and then (4 launches of 30
		// returned success on two Zen 4 cores; when it does report one, it
		// is a RuntimeError, "Task 1 error: ...").
		kind string
	}{
		{name: "default", setting: "", tvmPool: 0, kind: "ValueError"},
		{name: "TVM's pool kept", setting: "tvm", tvmPool: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("TVMDSOOP_THREAD_POOL", tc.setting)
			m, err := dsoop.Open(lib)
			require.NoError(t, err)
			defer m.Close()

			out, err := callParallel(m, "pool")
			require.NoError(t, err)
			assert.Equal(t, tc.tvmPool, out[0], "the launcher is libtvm_runtime.so's")

			out, err = callParallel(m, "tasks")
			require.NoError(t, err)
			tasks := out[32]
			require.GreaterOrEqual(t, tasks, int32(1))
			assert.Equal(t, int32(-1), ranOnce(out), "a task that did not run once: %v", out)
			for i := int32(0); i < tasks; i++ {
				assert.Equal(t, tasks, out[32+i], "tasks task %d was told of", i)
			}

			if tc.kind == "" {
				return
			}
			for call := 0; call < 50; call++ { // every time: a worker's error is not left to chance
				_, err = callParallel(m, "fail")
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.kind)
				assert.Contains(t, err.Error(), fmt.Sprintf("task %d of %d failed", tasks-1, tasks))
			}
		})
	}
}

// TestDsoopsPoolBarrierAndNesting: on dsoop's pool, every task passes the
// barrier only once all have reached it, a launch from inside a task runs
// alone (one task, on its thread) rather than waiting for the busy pool, and
// launches from many threads at once each run every task once: a thread that
// finds the pool busy runs its tasks itself.
func TestDsoopsPoolBarrierAndNesting(t *testing.T) {
	m, err := dsoop.Open(ccLibrary(t, parallelSource))
	require.NoError(t, err)
	defer m.Close()
	out, err := callParallel(m, "tasks")
	require.NoError(t, err)
	tasks := out[32]

	out, err = callParallel(m, "barrier")
	require.NoError(t, err)
	for i := int32(0); i < tasks; i++ {
		assert.Equal(t, 1+tasks, out[i], "task %d saw every task's write after the barrier", i)
	}

	out, err = callParallel(m, "nested")
	require.NoError(t, err)
	for i := int32(0); i < tasks; i++ {
		assert.Equal(t, int32(1), out[i], "the launch inside task %d", i)
	}

	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for call := 0; call < 50; call++ {
				out, err := callParallel(m, "tasks")
				if err != nil {
					t.Errorf("a concurrent launch: %v", err)
					return
				}
				if task := ranOnce(out); task >= 0 {
					t.Errorf("a concurrent launch of %d tasks ran task %d %d times", out[32], task, out[task])
					return
				}
			}
		}()
	}
	wg.Wait()
}
