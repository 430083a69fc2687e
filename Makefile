# make demo   compile a TVM function and run it inside TensorFlow
# make test   every test: Go (dlpack, dsoop, kernels) and Python (tf_op)
# make build  the op library, build/libtvm_dso_op.so
# make bench  side-by-side benchmarks: build/bench/results.json and benchmarks.md
#             (QUICK=1: fewer rounds, the small peers only; TUNE=N: also the bridge and peers models tuned with N trials)
# make bench-publish  the last make bench's results into docs/benchmarks.md
# make go-examples  the Go examples (dsoop on Go slices; a Go TF session)
# make test-gpu     the GPU harnesses: stream order, whole models, defop variants (needs an NVIDIA GPU; docs/gpu.md)
# make fuzz         longer fuzzing: the checks before loading, the VM executable verifier, legacy graphs and params
#                   (and corrupted models run), the Go argument frames
# make test-matrix  the core tests on TensorFlow 2.18-2.21, each in its own venv and build
# make test-tf VERSION=2.20   one of them
# make wheel        the binary wheel in dist/: the op library for each of TensorFlow 2.18-2.21
# make test-wheel   the wheel installed in a clean venv per TensorFlow, no toolchain on PATH
# make test-asan    the core tests with our C, C++ and cgo code under ASan and UBSan (build-asan/)
# Each target installs what it needs first: the .venv, Go modules, the build.

VENV    := .venv
PYTHON  := $(VENV)/bin/python
BUILD   := build
STAMP   := $(VENV)/.installed
HOST_PYTHON ?= python3

.PHONY: all setup build test test-tf test-matrix test-go test-python test-gpu go-examples run-go-examples demo bench bench-publish fuzz run-fuzz wheel test-wheel clean

all: build

setup: $(STAMP)

# tf_op itself is used from python/ in place (a .pth file, what an editable install
# amounts to), with the op library of build/; `pip install .` is for users.
$(STAMP): requirements/run.txt requirements/test.txt requirements/gpu.txt
	test -x $(PYTHON) || $(HOST_PYTHON) -m venv $(VENV)
	$(PYTHON) -m pip install --quiet -r requirements/test.txt -r requirements/gpu.txt
	$(PYTHON) -c 'import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()["purelib"], "tvmdsoop-dev.pth").write_text("$(abspath python)\n")'
	go mod download
	touch $@

# The project's own build turns on the GPU harness (opt-in for everyone else: it
# needs nvcc and TVM's compiler), so that make test checks it on this CPU.
$(BUILD)/build.ninja: CMakeLists.txt $(STAMP)
	cmake -S . -B $(BUILD) -G Ninja -DPython3_EXECUTABLE=$(abspath $(PYTHON)) -DTVMDSOOP_GPU_HARNESS=ON

build: $(BUILD)/build.ninja
	cmake --build $(BUILD)

# The Go targets need the cgo flags that CMake wrote to build/cgo.mk, so they run
# in a second make that reads it.
test: build
	$(MAKE) --no-print-directory test-go test-python

go-examples: build
	$(MAKE) --no-print-directory run-go-examples

# dsoop again under cgocheck2, which catches Go pointers stored in C memory
# without a pin: the rule the argument frames are built around.
test-go: run-go-examples
	go vet ./...
	go test -count=1 ./...
	GOEXPERIMENT=cgocheck2 go test -count=1 ./dsoop

# The Go examples, run on an add_one compiled by TVM.
run-go-examples:
	mkdir -p $(BUILD)/examples
	$(PYTHON) examples/build_add_one.py $(BUILD)/examples/add_one.so
	go run ./examples/go/addone $(BUILD)/examples/add_one.so
	go run ./examples/go/session $(BUILD)/examples/add_one.so

# Two pytest-xdist workers: most tests wait on one-threaded work (TVM's compiler in
# a kept worker, a TensorFlow trace), so two on 2 CPUs take 15 minutes where one
# took 29. A test file runs whole on one worker (loadfile), so a module's fixture
# (the wheel of test_install, a converted model) is made once; the session's test
# libraries are shared between workers (tests/python/shared_build.py).
# TEST_WORKERS=0: one process, as pytest alone runs. The 20 slowest steps are listed
# at the end: make test has 30 minutes from a fresh clone on 2 CPUs, and they say
# where the time went.
TEST_WORKERS ?= 2
test-python:
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=20 tests/python

# Each TensorFlow in .venv-tf$(VERSION) and build-tf$(VERSION) (tests/tf_matrix.sh);
# the test libraries are still compiled by the .venv's TVM.
TF_VERSIONS := 2.18 2.19 2.20 2.21
test-tf: setup
	tests/tf_matrix.sh $(VERSION)

test-matrix: setup
	for v in $(TF_VERSIONS); do tests/tf_matrix.sh $$v || exit 1; done

# One wheel for every TensorFlow of TF_VERSIONS, each op library built in its own
# build-wheel-tfVERSION (packaging/build_wheel.py); the .venv's TVM compiles the
# function test-wheel runs.
wheel: setup
	$(PYTHON) packaging/build_wheel.py --versions $(shell echo $(TF_VERSIONS) | tr ' ' ',') --out dist

test-wheel: wheel
	for v in $(TF_VERSIONS); do packaging/check_wheel.sh $$v || exit 1; done

# Everything it runs is in build/gpu/, so a GPU machine without the .venv (or a
# network) runs it from a build/gpu/ made elsewhere; it builds only when missing.
GPU_HARNESS := $(BUILD)/gpu/stream_harness $(BUILD)/gpu/libtvm_ffi.so $(BUILD)/gpu/slow_fill.so $(BUILD)/gpu/tvm_add_one.so $(BUILD)/gpu/results.json
GPU_CUDALOAD := TVMDSOOP_LIBRARY_PATH=$(BUILD)/gpu:$(BUILD)/gpu/tvm $(BUILD)/gpu/cudaload $(BUILD)/gpu/tvm_add_one_lib.so \
	$(BUILD)/gpu/models/mlp_cuda.so
GPU_MODELS := $(BUILD)/gpu/model_harness $(BUILD)/gpu/libtvm_ffi.so $(BUILD)/gpu/tvm/libtvm_runtime.so \
	$(BUILD)/gpu/tvm/libcudart.so.13 $(BUILD)/gpu/tvm/libtvm_runtime_cuda.so $(BUILD)/gpu/models
GPU_DEFOPS := $(BUILD)/gpu/defop_harness $(BUILD)/gpu/libtvm_ffi.so $(BUILD)/gpu/tvm/libtvm_runtime.so \
	$(BUILD)/gpu/tvm/libcudart.so.13 $(BUILD)/gpu/tvm/libtvm_runtime_cuda.so $(BUILD)/gpu/defop_ops_cuda.so
test-gpu:
	test -x $(BUILD)/gpu/defop_harness || $(MAKE) --no-print-directory build
	$(GPU_HARNESS)
	$(GPU_CUDALOAD)
	$(GPU_MODELS)
	$(GPU_DEFOPS)

demo: build
	$(PYTHON) examples/demo.py

# make test runs the fuzz seeds; this explores (FUZZTIME per target).
FUZZTIME ?= 5m
fuzz: build
	$(MAKE) --no-print-directory run-fuzz

run-fuzz:
	go test -run '^$$' -fuzz FuzzSealedCheck -fuzztime $(FUZZTIME) ./dsoop
	go test -run '^$$' -fuzz FuzzFramePack -fuzztime $(FUZZTIME) ./dsoop
	go test -run '^$$' -fuzz FuzzParseEmbeddedModules -fuzztime $(FUZZTIME) ./dsoop
	go test -run '^$$' -fuzz FuzzReadVMExecutable -fuzztime $(FUZZTIME) ./dsoop
	go test -run '^$$' -fuzz FuzzReadGraphJSON -fuzztime $(FUZZTIME) ./dsoop
	go test -run '^$$' -fuzz FuzzReadParamBlob -fuzztime $(FUZZTIME) ./dsoop
	go test -run '^$$' -fuzz FuzzReadLegacyBlob -fuzztime $(FUZZTIME) ./dsoop
	go test -run '^$$' -fuzz FuzzCorruptedModelRuns -fuzztime $(FUZZTIME) ./dsoop

# The peers' engines (ONNX Runtime, tf2onnx, LiteRT) are for make bench alone.
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): requirements/bench.txt $(STAMP)
	$(PYTHON) -m pip install --quiet -r requirements/test.txt -r requirements/bench.txt
	touch $@

bench: build $(BENCH_STAMP)
	$(PYTHON) bench/run.py $(if $(QUICK),--quick) $(if $(TUNE),--tune $(TUNE))

bench-publish: setup
	$(PYTHON) bench/run.py --publish

# ASan and UBSan over our C, C++ and cgo code (CMake's TVMDSOOP_SANITIZE, in
# build-asan/): the Go tests of dsoop and kernels under go test -asan, then the
# op's core Python tests with the sanitized op library and probe. TensorFlow and
# TVM are not sanitized, so Python gets the sanitizer runtimes by LD_PRELOAD
# (ASan's must be the first library loaded), as do the processes it starts.
# Leaks are checked in Go only: Python and TF never free their globals. A
# sanitizer's report exits 66, not 1: the probe's exit status 1 means a library
# its loader refused, which would pass the library (and hide the report).
ASAN_BUILD := build-asan
# The runtimes of the compiler cgo linked them from.
ASAN_PRELOAD = $(foreach lib,libasan.so libubsan.so,$(shell $$(go env CC) -print-file-name=$(lib)))
UBSAN_ENV := UBSAN_OPTIONS=print_stacktrace=1:exitcode=66
# go test links without symbols or DWARF (-s -w): a report would give bare addresses.
ASAN_GO_LDFLAGS := -ldflags='-s=false -w=false'
# The tests that run the op's kernels, tf_op.auto's pass and cluster kernel, and
# dsoop's C, on every kind of library and argument, hostile libraries included.
ASAN_PYTHON_TESTS := test_semantics.py test_module_errors.py test_tf_op.py test_legacy.py test_models.py test_eager_call.py \
	test_training.py test_auto.py
.PHONY: test-asan
$(ASAN_BUILD)/build.ninja: CMakeLists.txt $(STAMP)
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DPython3_EXECUTABLE=$(abspath $(PYTHON)) -DTVMDSOOP_SANITIZE=ON \
		-DTVMDSOOP_TESTS=OFF

test-asan: $(ASAN_BUILD)/build.ninja
	cmake --build $(ASAN_BUILD) --target tvm_dso_op tvmdsoop-probe tvmdsoop_eager_entry
	. $(ASAN_BUILD)/env.sh && $(UBSAN_ENV) ASAN_OPTIONS=exitcode=66 go test -count=1 $(ASAN_GO_LDFLAGS) ./dsoop ./kernels
	$(UBSAN_ENV) ASAN_OPTIONS=exitcode=66:detect_leaks=0 LD_PRELOAD="$(ASAN_PRELOAD)" \
		TVMDSOOP_LIBRARY=$(abspath $(ASAN_BUILD))/libtvm_dso_op.so TVMDSOOP_PROBE=$(abspath $(ASAN_BUILD))/tvmdsoop-probe \
		$(PYTHON) -m pytest -q $(addprefix tests/python/,$(ASAN_PYTHON_TESTS))

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-tf* build-wheel-tf* dist

-include $(BUILD)/cgo.mk
