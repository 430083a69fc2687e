"""Builds tests/gpu/cuda_funcs.cc with tvm-ffi's C++ build into OUT.so.

    python build_cuda_funcs.py OUT.so

A plain C++ build: the CUDA kernels are PTX that the driver compiles at run time.
"""

import shutil
import sys
import tempfile
from pathlib import Path

import tvm_ffi.cpp

source = Path(__file__).with_name("cuda_funcs.cc").read_text()
with tempfile.TemporaryDirectory() as build_dir:
    built = tvm_ffi.cpp.build_inline("cuda_funcs", cpp_sources=source, build_directory=build_dir)
    shutil.copy(built, sys.argv[1])
