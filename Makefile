# The two commands a newcomer runs: `make demo` and `make test` (which pip-installs the Python
# package's build and test requirements).
BUILD ?= build
CMAKE_ARGS ?=
JOBS ?= $(shell nproc)

.PHONY: all configure build test test-gpu test-asan test-tsan fuzz fuzz-build py-install pytest \
	examples check-install demo device-bin device-wheel soak-cpu clean

all: build

configure:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	$(MAKE) --no-print-directory pytest

test-gpu: build
	ctest --test-dir $(BUILD) --output-on-failure -L gpu

# Sanitizer builds of the C++ test suites, CPU only, each in its own build folder, -O1 with line
# tables for readable reports. Any report fails the run: ASan and UBSan stop at the first error
# (halt_on_error; UBSan is built with -fno-sanitize-recover), LeakSanitizer checks every exit
# (detect_leaks=1), TSan exits non-zero on a race. CI runs test-asan, test-tsan and fuzz.
SAN_CMAKE = -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" \
	-DCMAKE_CXX_COMPILER=clang++ -DMSA_CUDA=OFF -DMSA_BUILD_BENCH=OFF -DMSA_INSTALL=OFF
SAN_ENV = ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:print_stacktrace=1 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

# ASan + UBSan, with clang, in the build of the fuzz targets: one sanitized library serves both
# (a second build of it would cost CI minutes on 2 cores).
ASAN_BUILD ?= build-asan
ASAN_CMAKE = $(SAN_CMAKE) -DMSA_SANITIZE=address,undefined -DMSA_FUZZ=ON
test-asan:
	cmake -S . -B $(ASAN_BUILD) $(ASAN_CMAKE)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	$(SAN_ENV) ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

# ThreadSanitizer over the suites whose ops run OpenMP regions (every CPU op does), built with
# clang and its OpenMP runtime libomp, run with LLVM's Archer tool (libarcher.so, loaded through
# OMP_TOOL_LIBRARIES), which tells TSan about OpenMP's barriers, reductions and tasks. GCC's
# libgomp is not instrumented: TSan reports its own barriers as races (3 false reports on an
# 8-line parallel-for and reduction program, none with libomp and Archer), so gcc is not used
# here. libomp is not instrumented either: ignore_noninstrumented_modules keeps TSan to msa's and
# the tests' own accesses (without it every suite reported a race inside libomp's lock init).
# Left out: test_cli (MSA_BUILD_TOOLS=OFF; its subprocess runs the ops the other suites run) and
# Attention.PageTableWrittenDuringTheCallNeverReadsOutOfBounds, whose second thread writes the
# page table during the call on purpose (a race by design, which TSan reports: the library
# re-checks every id where it reads it, and test-asan checks that no read goes out of bounds).
TSAN_BUILD ?= build-tsan
ARCHER ?= $(realpath $(dir $(realpath $(shell command -v clang++)))../lib/libarcher.so)
test-tsan:
	@test -n "$(ARCHER)" || { echo "test-tsan: no libarcher.so next to clang++ (set ARCHER)"; exit 1; }
	cmake -S . -B $(TSAN_BUILD) $(SAN_CMAKE) -DMSA_SANITIZE=thread -DMSA_BUILD_TOOLS=OFF
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	OMP_TOOL_LIBRARIES=$(ARCHER) OMP_NUM_THREADS=4 \
		TSAN_OPTIONS=halt_on_error=1:ignore_noninstrumented_modules=1 \
		GTEST_FILTER=-Attention.PageTableWrittenDuringTheCallNeverReadsOutOfBounds \
		ctest --test-dir $(TSAN_BUILD) --output-on-failure -j $(JOBS)

# libFuzzer targets (fuzz/), each run for FUZZ_SECONDS on its seeds (fuzz/corpus/<target>, read
# only) and the corpus it grows in $(ASAN_BUILD)/corpus; a finding is written to
# $(ASAN_BUILD)/artifacts and fails the run. One OpenMP thread: the inputs are tiny, and one
# thread keeps a finding reproducible. The targets run $(JOBS) at a time.
FUZZ_SECONDS ?= 30
FUZZ_TARGETS = fuzz_args fuzz_csr fuzz_dlpack fuzz_codecs
fuzz-build:
	cmake -S . -B $(ASAN_BUILD) $(ASAN_CMAKE)
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target $(FUZZ_TARGETS)

fuzz: fuzz-build
	@$(MAKE) --no-print-directory -j $(JOBS) $(FUZZ_TARGETS:%=fuzz-run-%)

fuzz-run-%:
	@mkdir -p $(ASAN_BUILD)/corpus/$* $(ASAN_BUILD)/artifacts
	@OMP_NUM_THREADS=1 $(SAN_ENV) $(ASAN_BUILD)/fuzz/$* -max_total_time=$(FUZZ_SECONDS) -timeout=10 \
		-rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=$(ASAN_BUILD)/artifacts/$*- \
		$(ASAN_BUILD)/corpus/$* fuzz/corpus/$* > $(ASAN_BUILD)/$*.log 2>&1 \
		|| { tail -n 60 $(ASAN_BUILD)/$*.log; echo "fuzz: $* failed (log $(ASAN_BUILD)/$*.log)"; exit 1; }
	@echo "fuzz: $* ok, $$(grep -o 'executed_units: [0-9]*' $(ASAN_BUILD)/$*.log | grep -o '[0-9]*')" \
		"inputs in $(FUZZ_SECONDS) s"

# The Python package: `pip install .` into python3 (build requirements pinned in pyproject.toml,
# no build isolation so build-py/ rebuilds incrementally), then its pytest suite. CPU-only
# without a GPU: the CUDA kernels would take minutes to build and no test could run them.
PYTHON ?= python3
PIP = $(PYTHON) -m pip install -q --disable-pip-version-check --root-user-action=ignore
PY_BUILD_REQS = $(shell $(PYTHON) -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires']))")
PY_SKBUILD_ARGS ?= $(if $(shell nvidia-smi -L 2>/dev/null),,-C cmake.define.MSA_CUDA=OFF)

PY_TEST_REQS = $(shell $(PYTHON) -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['test']))")

py-install:
	$(PIP) $(PY_BUILD_REQS) $(PY_TEST_REQS)
	$(PIP) --no-build-isolation $(PY_SKBUILD_ARGS) .

pytest: py-install
	$(PYTHON) -m pytest python/tests -q -rs

# The GPU soak's calls on the CPU backend (scripts/gpu_soak.py --device cpu): a short run in CI
# keeps the script working between GPU sessions; on the GPU machine it runs without --device.
soak-cpu: py-install
	$(PYTHON) scripts/gpu_soak.py --device cpu --calls $(SOAK_CALLS)
SOAK_CALLS ?= 300

# The Python examples (examples/python) on the CPU backend, each checked against torch.
examples: py-install
	$(PYTHON) examples/python/sparse_layer.py --device cpu
	$(PYTHON) examples/python/serving_backend.py --device cpu

# The packaging checks of CI (scripts/check_install.sh): sdist, wheel, console script and the
# C++ package through pip, cmake --install and add_subdirectory; CPU-only, in temporary folders.
check-install:
	bash scripts/check_install.sh

demo: build
	$(BUILD)/tools/cli/msa demo

# GPU test and benchmark binaries in one flat folder for a GPU-machine session: carry it and run
# bench/device_session.sh there (built here, they run on the GPU machine unchanged).
DEVICE_BIN ?= build-device-bin
GPU_TARGETS = test_index_checks test_quant_gpu test_topk_gpu test_indexer_gpu test_icp_gpu test_csr_build test_logits_gpu test_token_topk_gpu \
	test_sparse_fwd test_sparse_fwd_paged test_decode_gpu test_pipeline_gpu test_sdsa_gpu bench_sparse_fwd \
	bench_indexer bench_indexer_fp4 bench_decode bench_logits bench_pipeline bench_latency l2_rate msa_cli
# device-bin also copies the CUPTI host trace (bench/host_trace.cpp) where the toolkit has CUPTI,
# and the ICP driver (tools/icp_driver) where NCCL is found.
device-bin: configure
	cmake --build $(BUILD) -j $(JOBS) --target $(GPU_TARGETS)
	mkdir -p $(DEVICE_BIN)
	cp $(BUILD)/tests/cuda/test_* $(BUILD)/bench/bench_sparse_fwd $(BUILD)/bench/bench_indexer $(BUILD)/bench/bench_indexer_fp4 \
		$(BUILD)/bench/bench_decode $(BUILD)/bench/bench_logits $(BUILD)/bench/bench_pipeline $(BUILD)/bench/bench_latency \
		$(BUILD)/bench/l2_rate $(BUILD)/tools/cli/msa $(DEVICE_BIN)/
	-cmake --build $(BUILD) --target msa_host_trace > /dev/null 2>&1 && cp $(BUILD)/bench/libmsa_host_trace.so $(DEVICE_BIN)/
	-cmake --build $(BUILD) --target msa_icp_driver > /dev/null 2>&1 && cp $(BUILD)/tools/icp_driver/msa_icp_driver $(DEVICE_BIN)/

# The Python package with its CUDA backend, as a wheel for the GPU machine's python (3.12 there):
# `make device-wheel DEVICE_PYTHON=python3.12`, then carry .whl and run device_session.sh pytest.
DEVICE_PYTHON ?= python3.12
device-wheel:
	$(DEVICE_PYTHON) -m pip install -q --disable-pip-version-check --root-user-action=ignore $(PY_BUILD_REQS)
	rm -f .whl/msa_attention-*.whl
	$(DEVICE_PYTHON) -m pip wheel -q --no-build-isolation --no-deps -C cmake.define.MSA_CUDA=ON -w .whl .

clean:
	rm -rf $(BUILD)
