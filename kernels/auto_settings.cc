// auto_settings.cc: the settings of automatic clustering (auto_settings.h),
// behind a mutex: the pass reads them once per graph, a cluster kernel once per
// call of a shape it has not decided yet. Whether the pass is on is mirrored in
// an atomic, which every call of a cluster kernel reads.
#include "kernels/auto_settings.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace {

// The defaults (docs/auto.md): clusters of 2 ops or more, timed against TF,
// compiled while the first call of each shape waits, at most 8 shapes each.
TvmdsoopAutoSettings Defaults() {
  const char* env = std::getenv("TVMDSOOP_AUTO");
  const bool enabled = env != nullptr && std::strcmp(env, "1") == 0;
  return TvmdsoopAutoSettings{enabled ? 1 : 0, 2, 1, 1, 8};
}

std::mutex& Mutex() {
  static auto* mu = new std::mutex();
  return *mu;
}

TvmdsoopAutoSettings& Current() {
  static auto* settings = new TvmdsoopAutoSettings(Defaults());
  return *settings;
}

std::atomic<int>& Enabled() {
  static auto* enabled = new std::atomic<int>(Defaults().enabled);
  return *enabled;
}

}  // namespace

extern "C" void tvmdsoop_auto_settings_set(TvmdsoopAutoSettings settings) {
  std::lock_guard<std::mutex> lock(Mutex());
  Current() = settings;
  Enabled().store(settings.enabled, std::memory_order_release);
}

extern "C" TvmdsoopAutoSettings tvmdsoop_auto_settings_get(void) {
  std::lock_guard<std::mutex> lock(Mutex());
  return Current();
}

extern "C" int tvmdsoop_auto_enabled(void) { return Enabled().load(std::memory_order_acquire); }
