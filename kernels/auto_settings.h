// auto_settings.h: the settings of automatic clustering (tf_op.auto) that the
// C++ side reads: the pass, whether to run and how large a cluster must be; the
// cluster kernel, how it treats a new input shape. Go holds the rest (the
// compiler's Python, the cache folder) and the report; it sets these through
// tvmdsoop_auto_settings_set when tf_op.auto.enable/disable is called.
#ifndef TVMDSOOP_KERNELS_AUTO_SETTINGS_H_
#define TVMDSOOP_KERNELS_AUTO_SETTINGS_H_

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int enabled;           // the pass clusters graphs; cluster kernels run TVM
  int min_cluster_size;  // the fewest ops a cluster may have (constants not counted)
  int timing_fallback;   // a compiled shape slower than TF on its first runs goes back to TF
  int wait;              // a call of a shape being compiled waits for it (else TF runs it)
  int max_shapes;        // the input shapes a cluster compiles; later ones run TF
} TvmdsoopAutoSettings;

// Replaces the settings (Go: kernels/auto.go). Until the first call they are the
// defaults, enabled when the environment has TVMDSOOP_AUTO=1.
void tvmdsoop_auto_settings_set(TvmdsoopAutoSettings settings);

// The settings now.
TvmdsoopAutoSettings tvmdsoop_auto_settings_get(void);

// Whether the pass is on, without the settings' mutex: what a cluster kernel
// reads on each call.
int tvmdsoop_auto_enabled(void);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // TVMDSOOP_KERNELS_AUTO_SETTINGS_H_
