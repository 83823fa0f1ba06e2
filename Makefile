# The two commands of the README (`make demo`, `make test`) and their friends. Every target installs
# what is missing first (scripts/install-deps is idempotent and quick when all is present).
PRESET ?= release
JOBS ?= $(shell nproc)
TROUPE_CUDA ?= AUTO
export TROUPE_CUDA

.PHONY: deps build test demo bench fuzz asan install clean

deps:
	@scripts/install-deps

build: deps
	cmake --preset $(PRESET) >/dev/null
	cmake --build --preset $(PRESET) -j $(JOBS)

test: build
	ctest --preset $(PRESET) -j $(JOBS)

asan:
	$(MAKE) test PRESET=asan-ubsan

demo: build
	scripts/demo build/$(PRESET)

bench: build
	scripts/bench build/$(PRESET)

# The troupe binary to $(PREFIX)/bin and the embedded model to $(PREFIX)/share/troupe/models.
PREFIX ?= /usr/local
install: build
	cmake --install build/$(PRESET) --prefix $(PREFIX)

# Each libFuzzer target runs for FUZZ_SECONDS (default 60) from its seed corpus.
FUZZ_SECONDS ?= 60
fuzz: deps
	cmake --preset fuzz >/dev/null
	cmake --build --preset fuzz -j $(JOBS) --target troupe_fuzzers
	scripts/fuzz build/fuzz $(FUZZ_SECONDS)

clean:
	rm -rf build
