# The two commands a newcomer runs: `make demo` and `make test`. Both install what they need.
BUILD ?= build
CMAKE_ARGS ?=
JOBS ?= $(shell nproc)

.PHONY: all deps configure build test test-cpu test-gpu demo clean

all: build

deps:
	python3 scripts/setup_deps.py

configure: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-gpu: build
	ctest --test-dir $(BUILD) --output-on-failure -L gpu

demo: build
	$(BUILD)/tools/cli/msa demo

clean:
	rm -rf $(BUILD)
