# quantd: build on the CUDA devel image, run on the CUDA base image (cudart is linked statically,
# so the runtime image needs only the driver, which the NVIDIA container toolkit mounts).
# The build stage runs the same make targets as CI (.ci/run): `make all` and `make test-unit`.
ARG CUDA_VERSION=12.6.3
ARG UBUNTU=ubuntu24.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      make gcc libc6-dev pkg-config libcjson-dev libmicrohttpd-dev libcmocka-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# x86-64-v2: the image must run on any x86-64 GPU host, not only on the builder's CPU
RUN make all NVCC=/usr/local/cuda/bin/nvcc ARCH_FLAGS=-march=x86-64-v2 \
 && make test-unit NVCC=/usr/local/cuda/bin/nvcc ARCH_FLAGS=-march=x86-64-v2

FROM nvidia/cuda:${CUDA_VERSION}-base-${UBUNTU}
# the VERSION file's (tests/deploy checks that the two agree)
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title=quantd \
      org.opencontainers.image.version=${VERSION}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libcjson1 libmicrohttpd12t64 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin quantd
COPY --from=build /src/bin/quantd /usr/local/bin/quantd
USER 10001:10001
# every setting is a QUANTD_* variable (quantd serve --help); these are the image's defaults
ENV QUANTD_LISTEN=0.0.0.0:8080 \
    QUANTD_BACKEND=auto \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=15s --retries=3 CMD ["quantd", "healthcheck"]
ENTRYPOINT ["quantd", "serve"]
