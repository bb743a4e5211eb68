#!/usr/bin/env bash
# Installs the MCP clients the client-matrix test drives (tests/suite/clients.rs):
# the official Python SDK 1.x and 2.x (each in its own venv) and the
# TypeScript SDK with the Inspector CLI. Idempotent and quiet: a client that
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

node_dir="$root/node"
mkdir -p "$node_dir"
cp "$here/package.json" "$node_dir/package.json"
if ! cmp -s "$here/package.json" "$node_dir/.installed" 2>/dev/null \
    || [ ! -d "$node_dir/node_modules/@modelcontextprotocol/sdk" ]; then
    (cd "$node_dir" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
    cp "$here/package.json" "$node_dir/.installed"
fi
