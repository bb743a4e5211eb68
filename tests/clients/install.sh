#!/usr/bin/env bash
# Installs the MCP clients the client-matrix test drives (tests/suite/clients.rs):
# the official Python SDK 1.x and 2.x (each in its own venv) and the
# TypeScript SDK with the Inspector CLI; also the Python package's test venv
# and the OpenAI and Anthropic packages (their tool types). Idempotent and quiet: a client that
# is already there at the wanted version is not installed again.
set -euo pipefail
root="${1:-$(dirname "$0")/../../target/mcp-clients}"
mkdir -p "$root"
root="$(cd "$root" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"

venv() { # dir, requirement
    local dir="$root/$1" req="$2"
    if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c 'import mcp' 2>/dev/null \
        && [ -f "$dir/.req" ] && [ "$(cat "$dir/.req")" = "$req" ]; then
        return
    fi
    rm -rf "$dir"
    /usr/bin/python3 -m venv "$dir"
    "$dir/bin/pip" install -q --disable-pip-version-check "$req"
    echo "$req" > "$dir/.req"
}
venv py1 'mcp>=1.20,<2'
venv py2 'mcp>=2,<3'

# The Python package (clients/python) with the libraries it integrates
# with, as a user installs it: `pip install ./clients/python rlms
# smolagents` into a fresh venv (tests/suite/pyclient.rs runs its pytest
# suite and its README's examples there). The package itself is installed
# again every time, so the venv always holds this tree's copy.
pkg="$here/../../clients/python"
pyclient="$root/pyclient"
libs='rlms==0.1.3 smolagents==1.26.0 pytest'
if [ ! -x "$pyclient/bin/python" ] || [ "$(cat "$pyclient/.req" 2>/dev/null)" != "$libs" ]; then
    rm -rf "$pyclient"
    /usr/bin/python3 -m venv "$pyclient"
    "$pyclient/bin/pip" install -q --disable-pip-version-check "$pkg" $libs
    echo "$libs" > "$pyclient/.req"
fi
"$pyclient/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$pkg"
# The package works with the SDK 1.x too: its client tests run in py1 as well.
"$root/py1/bin/python" -c 'import pytest' 2>/dev/null \
    || "$root/py1/bin/pip" install -q --disable-pip-version-check pytest
"$root/py1/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$pkg"
# The official Prometheus text parser (the `prometheus_client` package):
# tests/suite/service.rs reads `serve --metrics` with it, beside the SDK.
"$root/py1/bin/python" -c 'import prometheus_client.parser' 2>/dev/null \
    || "$root/py1/bin/python" -m pip install -q --disable-pip-version-check 'prometheus_client>=0.20,<1'
# rlms' own tests, from its source distribution on PyPI (the wheel has
# none): tests/suite/pyclient.rs runs its environment tests against the
# cellbox environment.
if [ ! -d "$pyclient/rlms-src/tests" ]; then
    rm -rf "$pyclient/rlms-src" "$pyclient/rlms-sdist"
    "$pyclient/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary :all: \
        -d "$pyclient/rlms-sdist" 'rlms==0.1.3'
    mkdir -p "$pyclient/rlms-src"
    tar -xzf "$pyclient"/rlms-sdist/rlms-0.1.3.tar.gz -C "$pyclient/rlms-src" --strip-components=1
fi

# The model APIs' own Python packages, whose tool types the output of
# `cellbox tools --format openai|anthropic` must fit (tests/suite/tooldefs.rs).
apitypes="$root/apitypes"
apireq="openai>=1.50,<3 anthropic>=0.40,<1"
if [ ! -x "$apitypes/bin/python" ] || [ "$(cat "$apitypes/.req" 2>/dev/null)" != "$apireq" ]; then
    rm -rf "$apitypes"
    /usr/bin/python3 -m venv "$apitypes"
    # shellcheck disable=SC2086
    "$apitypes/bin/pip" install -q --disable-pip-version-check $apireq
    echo "$apireq" > "$apitypes/.req"
fi

node_dir="$root/node"
mkdir -p "$node_dir"
cp "$here/package.json" "$node_dir/package.json"
if ! cmp -s "$here/package.json" "$node_dir/.installed" 2>/dev/null \
    || [ ! -d "$node_dir/node_modules/@modelcontextprotocol/sdk" ]; then
    (cd "$node_dir" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
    cp "$here/package.json" "$node_dir/.installed"
fi
