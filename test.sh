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
    # The console's browser tests drive Debian's chromium through its chromedriver (Selenium),
    # installed from the OS's packages if missing.
    if ! { command -v chromium && command -v chromedriver; } > /dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
            if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } > "$VENV/apt-chromium.log" 2>&1; then
                cat "$VENV/apt-chromium.log" >&2
                exit 1
            fi
        else
            echo "test.sh: the console's browser tests need chromium and chromium-driver (Debian); install them" >&2
            exit 1
        fi
    fi
    # A writer group's election tests run a real etcd v3 (Debian's etcd-server), installed
    # from the OS's packages if missing.
    if ! command -v etcd > /dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
            if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server; } > "$VENV/apt-etcd.log" 2>&1; then
                cat "$VENV/apt-etcd.log" >&2
                exit 1
            fi
        else
            echo "test.sh: the writer group tests need etcd; install etcd-server (Debian)" >&2
            exit 1
        fi
    fi
    # The consumer benchmark's smoke test runs its peers, Redis and NATS JetStream (Debian's
    # redis-server and nats-server), installed from the OS's packages if missing.
    if ! { command -v redis-server && command -v nats-server; } > /dev/null 2>&1; then
        if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
            if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server nats-server; } > "$VENV/apt-peers.log" 2>&1; then
                cat "$VENV/apt-peers.log" >&2
                exit 1
            fi
        else
            echo "test.sh: the consumer benchmark's peers need redis-server and nats-server; install them (Debian)" >&2
            exit 1
        fi
    fi
    # The Node.js clients (tests/node: the official RocketMQ 5 client and one of our own
    # contracts) need Node.js and npm, from the OS's packages where missing, and their npm
    # packages, installed from the committed lock file whenever it is newer than them.
    if ! command -v node > /dev/null || ! command -v npm > /dev/null; then
        if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
            if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; } > "$VENV/apt-node.log" 2>&1; then
                cat "$VENV/apt-node.log" >&2
                exit 1
            fi
        else
            echo "test.sh: the Node.js client tests need node and npm; install nodejs and npm (Debian)" >&2
            exit 1
        fi
    fi
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
        if ! "$RMQ5_VENV/bin/pip" install 'rocketmq-python-client>=5.1,<6' > "$RMQ5_VENV/install.log" 2>&1; then
            cat "$RMQ5_VENV/install.log" >&2
            exit 1
        fi
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
    if ! { "$VENV/bin/pip" install --upgrade pip && "$VENV/bin/pip" install -e '.[test]'; } > "$VENV/install.log" 2>&1; then
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
