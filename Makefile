# ddpvision front door: `make demo`, `make test`, `make bench`, `make install`.
# Site settings come from Makefile.inc; CMake is the one build system underneath.
include Makefile.inc

CMAKE_FLAGS = -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
              -DCMAKE_C_COMPILER=$(CC) -DCMAKE_CXX_COMPILER=$(CXX) \
              -DMPI_CXX_COMPILER=$(MPICXX) -DDDPV_MPIRUN=$(MPIRUN) \
              -DDDPV_WITH_CUDA=$(WITH_CUDA) -DCUDAToolkit_ROOT=$(CUDA_HOME) \
              "-DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCHS)" \
              -DCMAKE_INSTALL_PREFIX=$(PREFIX)
ifneq ($(HDF5_ROOT),)
CMAKE_FLAGS += -DHDF5_ROOT=$(HDF5_ROOT)
endif
ifneq ($(DNNL_ROOT),)
CMAKE_FLAGS += -Ddnnl_ROOT=$(DNNL_ROOT)
endif

.PHONY: all deps configure build test test-cluster sanitize fuzz demo bench bench-data install clean

all: build

deps:
	scripts/install-deps.sh

# A failed configure leaves a CMakeCache.txt behind; remove it so the next `make` configures again.
$(BUILD_DIR)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS) || { rm -f $@; exit 1; }

configure: deps
	cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900

# Slurm, multi-host (network namespaces) and install tests: tests/cluster/*_test.sh, as root.
test-cluster: build
	scripts/install-deps.sh --cluster || echo "test-cluster: could not install Slurm/munge; those tests will skip"
	BUILD_DIR=$(abspath $(BUILD_DIR)) MPIRUN=$(MPIRUN) JOBS=$(JOBS) tests/cluster/run_all.sh

# The tests under AddressSanitizer + UBSan in a build of their own (scripts/sanitize.sh): about
# 15 minutes on 2 cores, so not part of `make test`.
sanitize: deps
	SANITIZE_DIR=$(SANITIZE_DIR) JOBS=$(JOBS) CC=$(CC) CXX=$(CXX) MPICXX=$(MPICXX) MPIRUN=$(MPIRUN) \
	  scripts/sanitize.sh

# The libFuzzer targets (docs/fuzzing.md) in a clang + ASan + UBSan build of their own
# (scripts/fuzz.sh), each for FUZZ_SECONDS; CI runs them for 30 s each.
FUZZ_SECONDS ?= 60
fuzz: deps
	scripts/install-deps.sh --fuzz
	FUZZ_DIR=$(FUZZ_DIR) FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) MPICXX=$(MPICXX) scripts/fuzz.sh

demo: build
	MPIRUN=$(MPIRUN) BUILD_DIR=$(BUILD_DIR) scripts/demo.sh

bench: build
	scripts/install-deps.sh --bench
	MPIRUN=$(MPIRUN) BUILD_DIR=$(BUILD_DIR) scripts/bench.sh
	BUILD_DIR=$(BUILD_DIR) scripts/bench-data.sh

# The JPEG input pipeline against torchvision's, and the converter's rate (scripts/bench-data.sh);
# also the last step of `make bench`.
bench-data: build
	scripts/install-deps.sh --bench
	BUILD_DIR=$(BUILD_DIR) scripts/bench-data.sh

install: build
	cmake --install $(BUILD_DIR) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD_DIR) $(SANITIZE_DIR) $(FUZZ_DIR)
