#!/usr/bin/env bash
# The test suite: set up a virtualenv with the test extras, then run pytest (arguments
# are passed on, e.g. `bash test.sh -k fixture`).
set -euo pipefail
cd "$(dirname "$0")"
VENV="${RMQSTORE_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
# The installs that leave the virtualenv's packages alone (the OS's packages, the RocketMQ 5
# client's virtualenv, npm's packages) run beside pip's, each in the background: all of them
# mostly wait on downloads. Each prints its own log if it fails; any failing fails this script.
os_and_npm() {
    # The OS's packages the tests use, installed with one `apt-get` where missing: Debian's
    # chromium and its chromedriver (the console's browser tests, through Selenium), a real
    # etcd v3 (a writer group's election tests), Redis and NATS JetStream (the consumer
    # benchmark's peers, which its smoke test runs), Node.js with npm (tests/node: the
    # official RocketMQ 5 client and one of our own contracts), and gRPC's C++ library
    # with pkg-config (benchmarks/native_client.py's producers, which the front probe's
    # smoke test builds).
    missing=()
    command -v chromium > /dev/null 2>&1 || missing+=(chromium)
    command -v chromedriver > /dev/null 2>&1 || missing+=(chromium-driver)
    command -v etcd > /dev/null 2>&1 || missing+=(etcd-server)
    command -v redis-server > /dev/null 2>&1 || missing+=(redis-server)
    command -v nats-server > /dev/null 2>&1 || missing+=(nats-server)
    command -v node > /dev/null 2>&1 || missing+=(nodejs)
    command -v npm > /dev/null 2>&1 || missing+=(npm)
    command -v pkg-config > /dev/null 2>&1 || missing+=(pkg-config)
    pkg-config --exists grpc++ 2> /dev/null || missing+=(libgrpc++-dev)
    if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
            if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } > "$VENV/apt.log" 2>&1; then
                cat "$VENV/apt.log" >&2
                exit 1
            fi
        else
            echo "test.sh: the tests need these Debian packages: ${missing[*]}; install them" >&2
            exit 1
        fi
    fi
    # The Node.js clients' npm packages, installed from the committed lock file whenever it
    # is newer than them.
    if [ ! -d tests/node/node_modules ] || [ tests/node/package-lock.json -nt tests/node/node_modules ]; then
        if ! (cd tests/node && npm ci --no-audit --no-fund) > "$VENV/npm.log" 2>&1; then
            cat "$VENV/npm.log" >&2
            exit 1
        fi
        touch tests/node/node_modules
    fi
    # The ACL tests' Node.js client of rmqstore.v1 (tests/node_client): its npm packages into the virtualenv.
    if [ ! -d "$VENV/node/node_modules/@grpc/grpc-js" ] || [ tests/node_client/package.json -nt "$VENV/node/package.json" ]; then
        mkdir -p "$VENV/node"
        cp tests/node_client/package.json "$VENV/node/package.json"
        if ! npm install --prefix "$VENV/node" --no-audit --no-fund > "$VENV/npm.log" 2>&1; then
            cat "$VENV/npm.log" >&2
            exit 1
        fi
    fi
}
rmq5_client() {
    # The official RocketMQ 5 Python client, in a virtualenv of its own (it bundles its own
    # copy of the apache.rocketmq.v2 protos): tests/test_rocketmq5_clients.py runs it as a
    # separate process. Made once; a later run only checks it is there.
    if [ ! -x "$RMQ5_VENV/bin/python" ] || ! "$RMQ5_VENV/bin/python" -c 'import rocketmq' 2> /dev/null; then
        python3 -m venv "$RMQ5_VENV"
        if ! install_into "$RMQ5_VENV" 'rocketmq-python-client>=5.1,<6' > "$RMQ5_VENV/install.log" 2>&1; then
            cat "$RMQ5_VENV/install.log" >&2
            exit 1
        fi
    fi
}
# pip installs into a virtualenv, or uv where RMQSTORE_UV names its binary (.ci/run installs
# a pinned uv: the same packages, resolved and unpacked in parallel; each module compiled to
# bytecode at install, as pip does, since CI's processes keep none of what they compile).
install_into() {
    local venv="$1"
    shift
    if [ -n "${RMQSTORE_UV:-}" ]; then
        "$RMQSTORE_UV" pip install --python "$venv/bin/python" --compile-bytecode "$@"
    else
        "$venv/bin/pip" install "$@"
    fi
}
RMQ5_VENV="${RMQSTORE_RMQ5_VENV:-.venv-rmq5}"
os_and_npm &
os_and_npm_pid=$!
rmq5_client &
rmq5_pid=$!
# The install is editable: as in run.sh (and with its stamp), pip runs only when what the
# install builds (dependencies, the compiled protobuf stubs, the C codecs) is stale or gone.
STAMP="$VENV/rmqstore-install.sha256"
current="$(find pyproject.toml setup.py protos/rmqstore common/codec/speedups_c -type f \( -name '*.proto' -o -name '*.c' -o -name '*.h' -o -name '*.toml' -o -name '*.py' \) -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)"
built() { [ -d protos/gen/rmqstore/v1 ] && compgen -G 'common/codec/_speedups*.so' > /dev/null; }
if [ ! -x "$VENV/bin/rmqstore" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$current" ] || ! built; then
    # Install quietly; show pip's output only if it fails.
    if ! { [ -n "${RMQSTORE_UV:-}" ] || "$VENV/bin/pip" install --upgrade pip; } > "$VENV/install.log" 2>&1 \
        || ! install_into "$VENV" -e '.[test]' >> "$VENV/install.log" 2>&1; then
        cat "$VENV/install.log" >&2
        exit 1
    fi
    echo "$current" > "$STAMP"
fi
status=0
wait "$os_and_npm_pid" || status=1
wait "$rmq5_pid" || status=1
[ "$status" = 0 ] || exit 1
export RMQSTORE_RMQ5_VENV="$(cd "$RMQ5_VENV" && pwd)"
exec "$VENV/bin/python" -m pytest "$@"
