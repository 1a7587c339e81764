# syntax=docker/dockerfile:1
# One image for every Praesto process: praesto-hooks (hooks + admission), praesto-orphans,
# praesto-agent (node agent, PVC-mode downloader Job, init-container wait) and
# praesto-csi (CSI node plugin). The chart picks the command per container.
#
# Base pinned by tag AND multi-arch index digest (python:3.11.14-slim-bookworm).
# Bump both together.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

# --- builder: build the wheel and install it with its pinned dependencies into a venv
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/praesto
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY praesto ./praesto
COPY hooks ./hooks
COPY agent ./agent
# csi/ includes the generated gRPC stubs (csi/proto/csi_pb2*.py), committed and
# checked reproducible by the test suite; nothing is generated at build time.
COPY csi ./csi
# The build backend is exactly pyproject's [build-system].requires (one pin, read from there).
# The smoke step imports every entry point's module (the praesto CLI, hooks server, agent CLI
# and daemon, CSI plugin and its server): an import the wheel cannot satisfy fails the build.
RUN /opt/praesto/bin/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires']))" > /tmp/build-requires.txt \
 && /opt/praesto/bin/pip install -r /tmp/build-requires.txt \
 && /opt/praesto/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && /opt/praesto/bin/pip install /wheels/praesto-*.whl \
 && cd / \
 && /opt/praesto/bin/python -c "import praesto.hooks.cli, praesto.hooks.serving.server, praesto.hooks.orphans.cli, praesto.hooks.orphans.releaser, praesto.agent.cli, praesto.agent.daemon, praesto.csi.cli, praesto.csi.server, praesto.csi.proto.csi_pb2" \
 && /opt/praesto/bin/praesto-agent run --help > /dev/null \
 && /opt/praesto/bin/pip uninstall -y pip setuptools

# --- runtime: the venv only, no compilers, no pip
FROM ${PYTHON_IMAGE}
# mount/umount (util-linux) for the CSI plugin's bind mounts.
RUN apt-get update \
 && apt-get install -y --no-install-recommends util-linux mount \
 && rm -rf /var/lib/apt/lists/*
COPY --from=builder /opt/praesto /opt/praesto
# MALLOC_ARENA_MAX: glibc gives each thread its own arena, which keeps what the thread freed; the
# agent's 32 download threads through Xet then held +395 MiB at peak instead of +266 MiB
# (bench/xet_memory_bench.py), against the agent's 512Mi limit.
ENV PATH=/opt/praesto/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MALLOC_ARENA_MAX=2 \
    HOME=/tmp
LABEL org.opencontainers.image.title="praesto" \
      org.opencontainers.image.description="Praesto model cache: hooks, node agent, CSI plugin, downloader" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/federicolepera/praesto"
# Non-root by default (the CSI container alone runs as root, set by the chart).
USER 65532:65532
WORKDIR /tmp
CMD ["praesto-hooks"]
