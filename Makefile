# msinv toolchain: build, test, install.
#
#   make            libms.a and the tools (CUDA kernels too when nvcc exists)
#   make test       the hermetic suite (CI runs this); ends "N passed, N failed"
#   make demo       the main job on the bundled fixtures
#   make check-asan the suite under AddressSanitizer + UBSan
#   make test-gpu   kernel tests against the CPU reference (needs a GPU)
#   make check-kernels-emu  the grouped GEMM's, flash attention's, the
#                   dense LoRA's and the router logits' kernel tests on the
#                   CPU, the kernels emulated thread by thread (tools/kemu;
#                   no GPU)
#   make bench      CPU benchmarks (ratios against a reference in one script)
#   make bench-train-gpu  the LoRA step of mstrain --device cuda against
#                   transformers + PEFT on the same GPU (PYTHON: one with torch)
#   make python     libms.so and the Python package (python/) in .venv
#   make install PREFIX=/usr/local
#
# BUILD=dir puts every output under dir (default build/), so several trees
# (asan, fault injection) can coexist.

BUILD   ?= build
PREFIX  ?= /usr/local
CC      ?= cc
PKGS     = sqlite3 libcrypto libcjson libarchive libzstd
DEBPKGS  = libsqlite3-dev libssl-dev libcjson-dev libarchive-dev libzstd-dev \
           pkg-config sqlite3 python3-venv bc openssl

PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

# The Debian package that provides each pkg-config name, so that a machine
# without the -dev packages is told which ones to install before the first
# compiler error about a missing header.
DEB_sqlite3    = libsqlite3-dev
DEB_libcrypto  = libssl-dev
DEB_libcjson   = libcjson-dev
DEB_libarchive = libarchive-dev
DEB_libzstd    = libzstd-dev
PKG_MISSING := $(shell command -v pkg-config >/dev/null 2>&1 || echo pkg-config; \
  for p in $(PKGS); do pkg-config --exists $$p 2>/dev/null || echo $$p; done)
DEB_MISSING := $(sort $(foreach p,$(PKG_MISSING),$(or $(DEB_$(p)),$(p))))

WARN     = -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
           -Wpointer-arith -Wformat=2 -Wno-unused-parameter
ifeq ($(CI),true)
WARN    += -Werror
endif
ifeq ($(WERROR),1)
WARN    += -Werror
endif
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
ALL_CFLAGS = -std=c11 -D_GNU_SOURCE -pthread $(WARN) $(CFLAGS) $(EXTRA_CFLAGS) \
             -Isrc $(PKG_CFLAGS)
# --as-needed: a binary needs only the libraries it calls at run time, so
# tools built here also run on GPU machines without the -dev packages
LDLIBS  = -Wl,--as-needed $(PKG_LIBS) -lpthread -lm $(EXTRA_LDLIBS)

# CUDA: detected, compiled and linked whenever nvcc exists, GPU or not.
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
KERN_SRC := $(wildcard kernels/*.cu)
ifneq ($(NVCC),)
ifneq ($(KERN_SRC),)
HAVE_CUDA = 1
endif
endif
NVFLAGS ?= -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 \
           -gencode=arch=compute_90,code=compute_90 -Xcompiler -fPIC,-Wall -Isrc -Ikernels
ifeq ($(HAVE_CUDA),1)
ALL_CFLAGS += -DMS_HAVE_CUDA=1 -DMS_QUANT_GPU=1
KERN_OBJ := $(KERN_SRC:kernels/%.cu=$(BUILD)/kernels/%.o) $(BUILD)/kernels/sdpa.o
# cuBLAS (the trainer's GEMMs) is not linked: kernels/train.cu opens it
# with dlopen when the first GPU model is built (found as CUDA's
# installation registers it, ld.so.conf, or through LD_LIBRARY_PATH).
CUDA_LIBS = -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/targets/x86_64-linux/lib \
            -lcudart_static -ldl -lrt -lstdc++
else
KERN_OBJ :=
CUDA_LIBS =
endif

# src/train/: the trainer core (model, LoRA, optimizer, data, checkpoints)
LIB_SRC := $(wildcard src/*.c) $(wildcard src/train/*.c)
LIB_HDR := $(wildcard src/*.h) $(wildcard src/train/*.h)
LIB_OBJ := $(LIB_SRC:src/%.c=$(BUILD)/src/%.o)
LIB      = $(BUILD)/libms.a
# The shared library: soname libms.so.MAJOR, the same objects as libms.a
# (compiled -fPIC), exporting exactly the functions ms.h declares (the
# version script is made from the header: tools/scripts/libms_map.sh).
VERSION  := $(shell sed -n 's/^#define MS_VERSION "\(.*\)"/\1/p' src/ms.h)
SOMAJOR  := $(firstword $(subst ., ,$(VERSION)))
SONAME   = libms.so.$(SOMAJOR)
SHLIB    = $(BUILD)/libms.so.$(VERSION)
SCHEMA   := $(sort $(wildcard schema/*.sql))

TOOL_NAMES := $(filter-out cli,$(basename $(notdir $(wildcard tools/*.c))))
TOOLS    := $(TOOL_NAMES:%=$(BUILD)/%)
CLI_OBJ  = $(BUILD)/tools/cli.o

UNIT_SRC := $(wildcard tests/unit/t_*.c)
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
FUZZ_SRC := $(wildcard tests/fuzz/fz_*.c)
REPLAY_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/tests/replay_%)

.PHONY: all shlib python deps pkgcheck test demo check-asan check-kernels-emu test-gpu test-interop bench bench-gpu bench-train-gpu bench-bins install clean venv fault goldens-train

# and $(BUILD)/commit: the commit the tools are now built from (all has
# just brought them up to date with the tree; "+" when src/ or kernels/
# hold uncommitted changes, "unknown" outside a git checkout), for what
# runs a build elsewhere and reports on it (bench-train-gpu's versions line)
all: $(LIB) $(TOOLS)
	@if c=$$(git rev-parse --short HEAD 2>/dev/null); then \
	  git diff --quiet HEAD -- src kernels 2>/dev/null || c="$$c+"; \
	else c=unknown; fi; echo "$$c" > $(BUILD)/commit

# ---- dependencies ---------------------------------------------------------
deps:
	@missing=""; for p in $(DEBPKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "deps: installing$$missing"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null || exit 3; \
	  else \
	    echo "deps: missing packages; run: sudo apt-get install$$missing" >&2; exit 3; \
	  fi; \
	fi

# Every compile waits for this check (order-only, so it never forces a
# rebuild); run as root, `make deps` installs what it names.
pkgcheck:
ifneq ($(DEB_MISSING),)
	@echo "make: missing libraries ($(PKG_MISSING)): install the packages with" >&2; \
	echo "  sudo apt-get install $(DEB_MISSING)" >&2; \
	echo "or run 'make deps' as root" >&2; exit 3
else
	@:
endif

# Python test oracles (numpy, ml_dtypes, safetensors, model-signing) live in a
# local virtual environment; tests that need them skip loudly without it.
venv: .venv/.stamp
.venv/.stamp: tests/requirements.txt
	python3 -m venv .venv
	.venv/bin/pip install -q --disable-pip-version-check -r tests/requirements.txt
	touch $@

# The trainer's goldens (tests/fixtures/train): transformers + PEFT on the
# CPU, at the versions pinned in tests/oracle/train_requirements.txt, in a
# virtual environment of their own (torch is large; make test never needs it).
TRAIN_VENV = $(BUILD)/venv-train
$(TRAIN_VENV)/.stamp: tests/oracle/train_requirements.txt
	python3 -m venv $(TRAIN_VENV)
	$(TRAIN_VENV)/bin/pip install -q --disable-pip-version-check -r tests/oracle/train_requirements.txt
	touch $@
goldens-train: all $(TRAIN_VENV)/.stamp
	$(TRAIN_VENV)/bin/python tests/oracle/train_golden.py \
	  --msconvert $(BUILD)/msconvert --out tests/fixtures/train

# ---- library ---------------------------------------------------------------
# Every library object is position independent, so one set serves libms.a
# and libms.so; the stamp rebuilds objects compiled before that was so.
$(BUILD)/src/%.o: src/%.c $(LIB_HDR) $(BUILD)/src/.pic | $(BUILD)/src $(BUILD)/src/train pkgcheck
	$(CC) $(ALL_CFLAGS) -fPIC -c -o $@ $<
$(BUILD)/src/.pic: | $(BUILD)/src
	touch $@

# The schema migrations are embedded in the binary, in order.
$(BUILD)/src/schema_sql.h: $(SCHEMA) tools/scripts/embed_schema.sh | $(BUILD)/src
	sh tools/scripts/embed_schema.sh $(SCHEMA) > $@.tmp && mv $@.tmp $@
$(BUILD)/src/inventory.o: $(BUILD)/src/schema_sql.h
$(BUILD)/src/inventory.o: ALL_CFLAGS += -I$(BUILD)/src

$(BUILD)/kernels/%.o: kernels/%.cu $(wildcard kernels/*.h kernels/*.cuh) $(wildcard src/*.h src/train/*.h) | $(BUILD)/kernels pkgcheck
	$(NVCC) $(NVFLAGS) -c -o $@ $<

# kernels/xgemm.cu: CUTLASS's Hopper grouped GEMM (the trainer's expert
# products), its headers fetched once into .deps by tools/fetch_headers.sh
# (PyPI's nvidia-cutlass, pinned); sm_90a for wgmma and TMA. Without the
# headers it compiles to the stub that refuses, and the trainer keeps its
# per-expert cuBLAS loop. No -Ikernels: kernels/mma.h would stand in for
# CUDA's <mma.h>, which CUTLASS includes.
CUTLASS_DIR = .deps/cutlass-4.2.0.0
XGFLAGS ?= -O3 -std=c++17 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a \
           --expt-relaxed-constexpr -Xcompiler -fPIC -Isrc
$(BUILD)/cutlass.stamp: tools/fetch_headers.sh | $(BUILD)/kernels
	@sh tools/fetch_headers.sh cutlass $(CUTLASS_DIR)
	@touch $@
$(BUILD)/kernels/xgemm.o: kernels/xgemm.cu $(wildcard kernels/*.h) $(wildcard src/*.h) \
		$(BUILD)/cutlass.stamp | $(BUILD)/kernels pkgcheck
	@if [ -f $(CUTLASS_DIR)/include/cutlass/cutlass.h ]; then \
	  echo "$(NVCC) $(XGFLAGS) -DMS_HAVE_CUTLASS -I$(CUTLASS_DIR)/include -c -o $@ $<"; \
	  $(NVCC) $(XGFLAGS) -DMS_HAVE_CUTLASS -I$(CUTLASS_DIR)/include -c -o $@ $<; \
	else \
	  echo "$(NVCC) $(NVFLAGS) -c -o $@ $<"; \
	  $(NVCC) $(NVFLAGS) -c -o $@ $<; \
	fi

# kernels/sdpa.cpp: cuDNN's fused attention through the cuDNN frontend
# (header-only C++, fetched once into .deps by tools/fetch_headers.sh, PyPI's
# nvidia-cudnn-frontend, pinned), cuDNN itself opened with dlopen at run
# time (the frontend's dynamic loading), so only cudnn.h is needed to
# build. Host code only: the C++ compiler, not nvcc (a minute instead of
# several). Without the frontend or cudnn.h it compiles to the stub that
# refuses, and the trainer keeps its flash kernels. The frontend's headers
# are system headers here: their warnings are not this project's.
CUDNN_FE_DIR = .deps/cudnn-frontend-1.32.0
CUDNN_INC = $(firstword $(foreach d,$(CUDA_HOME)/include /usr/include \
              /usr/include/x86_64-linux-gnu,$(if $(wildcard $(d)/cudnn_version.h),$(d))))
CXX_KFLAGS = -std=c++17 -O1 -fPIC -Wall -Wextra $(filter -Werror,$(ALL_CFLAGS)) -Isrc -Ikernels \
             -isystem $(CUDA_HOME)/include
CUDNN_KFLAGS = -DMS_HAVE_CUDNN_FE -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING \
               $(if $(filter-out $(CUDA_HOME)/include,$(CUDNN_INC)),-isystem $(CUDNN_INC)) \
               -isystem $(CUDNN_FE_DIR)/include
$(BUILD)/cudnn-frontend.stamp: tools/fetch_headers.sh | $(BUILD)/kernels
	@sh tools/fetch_headers.sh cudnn-frontend $(CUDNN_FE_DIR)
	@touch $@
$(BUILD)/kernels/sdpa.o: kernels/sdpa.cpp kernels/sdpa.h kernels/sdpa_graph.hpp kernels/flash.h $(wildcard src/*.h) \
		$(BUILD)/cudnn-frontend.stamp | $(BUILD)/kernels pkgcheck
	@if [ -f $(CUDNN_FE_DIR)/include/cudnn_frontend.h ] && [ -n "$(CUDNN_INC)" ]; then \
	  echo "$(CXX) $(CXX_KFLAGS) $(CUDNN_KFLAGS) -c -o $@ $<"; \
	  $(CXX) $(CXX_KFLAGS) $(CUDNN_KFLAGS) -c -o $@ $<; \
	else \
	  echo "$(CXX) $(CXX_KFLAGS) -c -o $@ $< (no cuDNN frontend: the stub)"; \
	  $(CXX) $(CXX_KFLAGS) -c -o $@ $<; \
	fi

$(LIB): $(LIB_OBJ) $(KERN_OBJ)
	rm -f $@
	ar rcs $@ $^

# The kernels are linked in (with the static CUDA runtime), so the device
# verified load is reachable through the shared library too.
$(BUILD)/libms.map: src/ms.h tools/scripts/libms_map.sh | $(BUILD)/src
	sh tools/scripts/libms_map.sh $(CC) src/ms.h > $@.tmp && mv $@.tmp $@
$(SHLIB): $(LIB_OBJ) $(KERN_OBJ) $(BUILD)/libms.map
	$(CC) -shared -Wl,-soname,$(SONAME) -Wl,--version-script=$(BUILD)/libms.map \
	  -o $@ $(LIB_OBJ) $(KERN_OBJ) $(LDLIBS) $(CUDA_LIBS)
	ln -sf libms.so.$(VERSION) $(BUILD)/$(SONAME)
	ln -sf $(SONAME) $(BUILD)/libms.so

shlib: $(SHLIB)

# The Python package, installed into the test environment with a copy of
# this build's libms.so in its directory (MSINV_LIBMS, when set, still
# takes precedence), so .venv/bin/python imports it as it is.
python: $(SHLIB) venv
	.venv/bin/pip install -q --disable-pip-version-check --no-build-isolation ./python
	cp $(SHLIB) "$$(.venv/bin/python -c 'import importlib.util as u; print(u.find_spec("msinv").submodule_search_locations[0])')/$(SONAME)"

# The wall: a tool sees the public header and nothing else. Tools compile
# against a directory holding only a copy of src/ms.h (not -Isrc), so a
# tool that includes an internal header (inventory.h, stage.h, ...) does
# not build. mstrain is the exception while the trainer's interface
# (src/train/) settles: it still compiles against the internal headers.
WALL_EXEMPT := mstrain
PUB_INC  = $(BUILD)/include
TOOL_CFLAGS = $(filter-out -Isrc,$(ALL_CFLAGS)) -I$(PUB_INC) -Itools
$(PUB_INC)/ms.h: src/ms.h | $(PUB_INC)
	cp src/ms.h $@
$(BUILD)/tools/%.o: tools/%.c $(PUB_INC)/ms.h tools/cli.h | $(BUILD)/tools pkgcheck
	$(CC) $(TOOL_CFLAGS) -c -o $@ $<
$(WALL_EXEMPT:%=$(BUILD)/tools/%.o): $(BUILD)/tools/%.o: tools/%.c $(LIB_HDR) tools/cli.h | $(BUILD)/tools pkgcheck
	$(CC) $(ALL_CFLAGS) -Itools -c -o $@ $<

$(BUILD)/%: $(BUILD)/tools/%.o $(CLI_OBJ) $(LIB)
	$(CC) $(ALL_CFLAGS) -o $@ $< $(CLI_OBJ) $(LIB) $(LDLIBS) $(CUDA_LIBS)

$(BUILD)/src $(BUILD)/src/train $(BUILD)/tools $(BUILD)/tests $(BUILD)/kernels $(BUILD)/bench $(BUILD)/include:
	mkdir -p $@

# ---- benchmark programs ------------------------------------------------------
# Built with the tools' own compile and link lines, and built (not run) by
# make test, so a library change that breaks a benchmark's link is caught
# where CI sees it. The GPU drivers need the CUDA runtime's headers.
BENCH_CPU := bench_nvfp4 bench_vload rl_ablation
BENCH_GPU := bench_gpu profile_quant
ifeq ($(HAVE_CUDA),1)
BENCH_BIN := $(BENCH_CPU:%=$(BUILD)/bench/%) $(BENCH_GPU:%=$(BUILD)/bench/%)
else
BENCH_BIN := $(BENCH_CPU:%=$(BUILD)/bench/%)
endif
$(BUILD)/bench/%: tools/bench/%.c $(LIB) | $(BUILD)/bench
	$(CC) $(ALL_CFLAGS) $(if $(HAVE_CUDA),-I$(CUDA_HOME)/include) -o $@ $< $(LIB) $(LDLIBS) $(CUDA_LIBS)

bench-bins: $(BENCH_BIN)

# ---- tests -----------------------------------------------------------------
$(BUILD)/tests/t_%: tests/unit/t_%.c $(wildcard tests/unit/*.h) $(LIB) | $(BUILD)/tests pkgcheck
	$(CC) $(ALL_CFLAGS) -Itests/unit -o $@ $< $(LIB) $(LDLIBS) $(CUDA_LIBS)

# the flash attention test calls the kernels' internal header
# (and CUDA's runtime header: its --bench mode times launches with events)
$(BUILD)/tests/t_flash_gpu: ALL_CFLAGS += -Ikernels -I$(CUDA_HOME)/include
# the grouped GEMM's likewise (its --bench opens cuBLAS, as the trainer does)
$(BUILD)/tests/t_ggemm_gpu: ALL_CFLAGS += -Ikernels -I$(CUDA_HOME)/include
# the router logits' test likewise (CUDA's runtime for its copies back)
$(BUILD)/tests/t_router_gpu: ALL_CFLAGS += -Ikernels -I$(CUDA_HOME)/include

$(BUILD)/tests/replay_%: tests/fuzz/%.c tests/fuzz/replay.c $(LIB) | $(BUILD)/tests
	$(CC) $(ALL_CFLAGS) -o $@ $< tests/fuzz/replay.c $(LIB) $(LDLIBS) $(CUDA_LIBS)

test-bins: all $(SHLIB) $(UNIT_BIN) $(REPLAY_BIN) $(BENCH_BIN)

test: deps
	@$(MAKE) --no-print-directory venv || echo "test: python oracles unavailable (no venv); oracle tests will be skipped" >&2
	@$(MAKE) --no-print-directory test-bins
	@BUILD=$(BUILD) sh tests/run.sh

check-asan: deps
	@$(MAKE) --no-print-directory BUILD=build-asan CC=clang OPT=-O1 \
	  EXTRA_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
	  EXTRA_LDLIBS="-fsanitize=address,undefined" test-bins
	@BUILD=build-asan MS_SANITIZED=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 sh tests/run.sh

# The fault-injection build: ms_fault() counts calls (MS_FAULT_ALLOC=N ...).
fault: deps
	@$(MAKE) --no-print-directory BUILD=build-fault EXTRA_CFLAGS=-DMS_FAULT_INJECTION all

# Not in CI: installs llm-compressor and nvidia-modelopt (GBs), regenerates
# tests/fixtures/golden with them and loads msconvert's outputs with the
# real loaders (tests/interop/).
test-interop: all
	@sh tests/interop/gen_goldens.sh
	@BUILD=$(BUILD) sh tests/interop/check.sh

test-gpu: all $(SHLIB) $(UNIT_BIN)
	@BUILD=$(BUILD) MS_TEST_GPU=1 sh tests/run.sh gpu

# Not in `make test` (minutes of CPU): a developer aid between GPU runs,
# not a substitute for test-gpu (tools/kemu/README.md says what it misses).
check-kernels-emu:
	@BUILD=$(BUILD) sh tools/kemu/run.sh
	@BUILD=$(BUILD) sh tools/kemu/run.sh --kernel flash
	@BUILD=$(BUILD) sh tools/kemu/run.sh --kernel router

demo: deps
	@$(MAKE) --no-print-directory all
	@BUILD=$(BUILD) sh tools/scripts/demo.sh

bench: deps
	@$(MAKE) --no-print-directory venv || true
	@$(MAKE) --no-print-directory all bench-bins
	@$(MAKE) --no-print-directory python || true
	@BUILD=$(BUILD) sh tools/bench/bench.sh

bench-gpu: all bench-bins
	@BUILD=$(BUILD) sh tools/bench/bench-gpu.sh

# writes tools/bench/RESULTS-train-gpu.md; tools/bench/bench_train_gpu.sh
# says which variables it reads
bench-train-gpu: all
	@BUILD=$(BUILD) sh tools/bench/bench_train_gpu.sh

# ---- install ---------------------------------------------------------------
install: all $(SHLIB)
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig \
	  $(DESTDIR)$(PREFIX)/include/ms $(DESTDIR)$(PREFIX)/share/man/man1 \
	  $(DESTDIR)$(PREFIX)/share/man/man5
	install -m 755 $(TOOLS) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 $(LIB) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(SHLIB) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libms.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(PREFIX)/lib/libms.so
	install -m 644 src/ms.h $(DESTDIR)$(PREFIX)/include/ms/
	install -m 644 man/*.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 644 man/*.5 $(DESTDIR)$(PREFIX)/share/man/man5/
	sed -e 's|@PREFIX@|$(PREFIX)|g' -e 's|@VERSION@|$(VERSION)|' \
	  -e 's|@REQUIRES@|$(PKGS)|' -e 's|@CUDA_LIBS@|$(CUDA_LIBS)|' \
	  tools/scripts/libms.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/libms.pc

clean:
	rm -rf build build-asan build-fault build-fuzz
