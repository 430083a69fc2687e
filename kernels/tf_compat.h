// tf_compat.h: the parts of TensorFlow's C++ API that the kernels use and
// that differ between the TF releases the op library builds against (2.18 to
// 2.21). Each is settled when the op library is compiled: an op library is
// built against one TF minor release and loads only there (its C++ symbols are
// that release's), so nothing here costs anything per call.
//
// The release is told by what its headers hold, not by a version number: TF
// 2.18 and 2.19 define TF_MAJOR_VERSION/TF_MINOR_VERSION in
// tensorflow/core/public/version.h, but from 2.20 on those are -D flags of TF's
// own Bazel build that neither the wheel's headers nor
// tf.sysconfig.get_compile_flags() carry (tensorflow/core/public/
// release_version.h stops with #error without them).
#ifndef TVMDSOOP_KERNELS_TF_COMPAT_H_
#define TVMDSOOP_KERNELS_TF_COMPAT_H_

// A span of device memory, what Stream::Memcpy takes: DeviceAddressBase from TF
// 2.21 (xla/stream_executor/device_address.h), DeviceMemoryBase before. 2.21
// keeps DeviceMemoryBase as a deprecated alias of DeviceAddressBase.
#if __has_include("xla/stream_executor/device_address.h")
#include "xla/stream_executor/device_address.h"
namespace tvmdsoop::tf_compat {
using DeviceAddress = ::stream_executor::DeviceAddressBase;
}  // namespace tvmdsoop::tf_compat
#else
#include "xla/stream_executor/device_memory.h"
namespace tvmdsoop::tf_compat {
using DeviceAddress = ::stream_executor::DeviceMemoryBase;
}  // namespace tvmdsoop::tf_compat
#endif

// Not included at all: xla/stream_executor/stream_executor.h, which in the TF
// 2.19 wheel includes LLVM headers that the wheel does not ship. The GPU kernel
// reads its device's ordinal from the device's AcceleratorDeviceInfo instead.

#endif  // TVMDSOOP_KERNELS_TF_COMPAT_H_
