# syntax=docker/dockerfile:1
#
# The rmqstore image: the `rmqstore` command (writer and query nodes, store tools) on a slim
# Python, run as a non-root user. Build from the repository root:
#
#   docker build -t REGISTRY/rmqstore:0.1.0 .
#
# Both stages use one pinned base, so the virtualenv built in the first runs unchanged in
# the second. Python 3.11 is the version the project is developed and tested on; move the
# pin deliberately (a newer patch release for security fixes, then rebuild).
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# ---- build: install the project and its dependencies into /opt/venv ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY protos protos
COPY common common
COPY cli cli
COPY client client
COPY writer writer
COPY query query
COPY service service
COPY pipeline pipeline
COPY console console
COPY proxy proxy
# The smoke check (.ci/smoke.py, the standard library only), run below against the
# virtualenv; it stays in this stage.
COPY .ci/smoke.py .ci/smoke.py
# setup.py compiles protos/ with grpcio-tools, a build requirement that pip installs in an
# isolated build environment: it never reaches the virtualenv. It also builds the codecs'
# C extension (common/codec/speedups_c/), which needs a C compiler and zlib's header in this
# stage only (the runtime image has zlib itself, which Python's zlib module links);
# every runtime dependency ships binary wheels. pip and setuptools leave the virtualenv
# once it is complete. Then the image's virtualenv must work as installed: the C extension
# loads, and CI's smoke check passes with it (a writer, a query node and the console on
# 127.0.0.1 in a temporary directory, a message sent and found byte for byte).
RUN apt-get update \
 && apt-get install --yes --no-install-recommends gcc libc6-dev zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install /src \
 && /opt/venv/bin/python -m pip uninstall --yes pip setuptools \
 && /opt/venv/bin/python -c "from rmqstore.common.codec.speedups import _speedups; assert _speedups" \
 && /opt/venv/bin/python /src/.ci/smoke.py /opt/venv/bin/rmqstore

# ---- runtime: the virtualenv, a non-root user, nothing else ----
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="rmqstore" \
      org.opencontainers.image.description="Apache RocketMQ 4.9's on-disk message store, served as gRPC microservices" \
      org.opencontainers.image.licenses="Apache-2.0"
# uid/gid 10001: the Helm chart's runAsUser/runAsGroup/fsGroup.
RUN groupadd --system --gid 10001 rmqstore \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin rmqstore \
 && mkdir /data \
 && chown 10001:10001 /data
COPY --from=build /opt/venv /opt/venv
# Bytecode was compiled at install time; with a read-only root file system nothing more
# can be written beside the sources.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /data
USER 10001:10001
# 10911: the writer (WriterService); 10912: a query node (QueryService). Both serve
# grpc.health.v1 and reflection. Pass --host 0.0.0.0 to listen beyond the container.
EXPOSE 10911 10912
ENTRYPOINT ["rmqstore"]
CMD ["--help"]
