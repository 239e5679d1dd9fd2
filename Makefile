# The two commands a newcomer runs: `make demo` and `make test` (which pip-installs the Python
# package's build and test requirements).
BUILD ?= build
CMAKE_ARGS ?=
JOBS ?= $(shell nproc)

.PHONY: all configure build test test-gpu py-install pytest examples check-install demo device-bin \
	device-wheel clean

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
GPU_TARGETS = test_index_checks test_quant_gpu test_topk_gpu test_indexer_gpu test_csr_build test_logits_gpu \
	test_sparse_fwd test_sparse_fwd_paged test_decode_gpu test_pipeline_gpu bench_sparse_fwd \
	bench_indexer bench_decode bench_logits bench_pipeline bench_latency msa_cli
device-bin: configure
	cmake --build $(BUILD) -j $(JOBS) --target $(GPU_TARGETS)
	mkdir -p $(DEVICE_BIN)
	cp $(BUILD)/tests/cuda/test_* $(BUILD)/bench/bench_sparse_fwd $(BUILD)/bench/bench_indexer \
		$(BUILD)/bench/bench_decode $(BUILD)/bench/bench_logits $(BUILD)/bench/bench_pipeline $(BUILD)/bench/bench_latency \
		$(BUILD)/tools/cli/msa $(DEVICE_BIN)/

# The Python package with its CUDA backend, as a wheel for the GPU machine's python (3.12 there):
# `make device-wheel DEVICE_PYTHON=python3.12`, then carry .whl and run device_session.sh pytest.
DEVICE_PYTHON ?= python3.12
device-wheel:
	$(DEVICE_PYTHON) -m pip install -q --disable-pip-version-check --root-user-action=ignore $(PY_BUILD_REQS)
	rm -f .whl/msa_attention-*.whl
	$(DEVICE_PYTHON) -m pip wheel -q --no-build-isolation --no-deps -C cmake.define.MSA_CUDA=ON -w .whl .

clean:
	rm -rf $(BUILD)
