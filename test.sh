#!/usr/bin/env bash
# The test suite: set up a virtualenv with the test extras, then run pytest (arguments
# are passed on, e.g. `bash test.sh -k fixture`).
set -euo pipefail
cd "$(dirname "$0")"
VENV="${RMQSTORE_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
# Install quietly; show pip's output only if it fails.
if ! { "$VENV/bin/pip" install --upgrade pip && "$VENV/bin/pip" install -e '.[test]'; } > "$VENV/install.log" 2>&1; then
    cat "$VENV/install.log" >&2
    exit 1
fi
# The benchmarks' C++ SYNC client (benchmarks/native_client.py), which the benchmark smoke
# test builds and runs, needs gRPC's C++ library: installed from the OS's packages if missing.
if ! pkg-config --exists grpc++ 2>/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libgrpc++-dev pkg-config; } > "$VENV/apt.log" 2>&1; then
            cat "$VENV/apt.log" >&2
            exit 1
        fi
    else
        echo "test.sh: the benchmark tests need gRPC's C++ library; install libgrpc++-dev and pkg-config (Debian)" >&2
        exit 1
    fi
fi
# The ACL tests run a Node.js client of rmqstore.v1 (tests/node_client): Node.js and npm
# from the OS's packages where missing, the client's npm packages into the virtualenv.
if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; } > "$VENV/apt-node.log" 2>&1; then
            cat "$VENV/apt-node.log" >&2
            exit 1
        fi
    else
        echo "test.sh: the ACL tests need Node.js and npm; install nodejs and npm (Debian)" >&2
        exit 1
    fi
fi
if [ ! -d "$VENV/node/node_modules/@grpc/grpc-js" ] || [ tests/node_client/package.json -nt "$VENV/node/package.json" ]; then
    mkdir -p "$VENV/node"
    cp tests/node_client/package.json "$VENV/node/package.json"
    if ! npm install --prefix "$VENV/node" --no-audit --no-fund > "$VENV/npm.log" 2>&1; then
        cat "$VENV/npm.log" >&2
        exit 1
    fi
fi
exec "$VENV/bin/python" -m pytest "$@"
