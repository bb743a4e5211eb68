#!/usr/bin/env bash
# Build the cellbox image from this repository without a container
# registry, and try it: a Debian bookworm base image made here with
# debootstrap (python3, CA certificates) and imported into the engine, the
# two binaries built on this machine, then the top-level Containerfile
# built against both, and `doctor`, a Python cell and a Rhai cell run in
# the image with the settings docs/containers.md explains.
#
#   sudo container/build-local.sh                  # podman; ENGINE=docker for Docker
#
# Needs root (debootstrap), the engine, debootstrap, and Debian's mirror
# (DEBIAN_MIRROR). CELLBOX_BINARIES=DIR takes the two binaries from DIR
# instead of `cargo build --release --locked`; CELLBOX_IMAGE names the
# image (default cellbox:local). The base image is made once and kept
# (localhost/cellbox-base:bookworm); remove it to make it again.
set -euo pipefail
cd "$(dirname "$0")/.."
engine=${ENGINE:-podman}
# ENGINE_ARGS: before every engine command, e.g. `--runtime runc` for
# Podman on a host with cgroup v1 and v2 both mounted ("hybrid"), which
# crun refuses.
read -r -a engine_args <<<"${ENGINE_ARGS:-}"
# RUN_ARGS: added to each `run`, e.g. `--ulimit nofile=4096:4096 --ulimit
# nproc=4096:4096` where the engine's default limits are above this host's.
read -r -a run_args <<<"${RUN_ARGS:-}"
base=localhost/cellbox-base:bookworm
image=${CELLBOX_IMAGE:-cellbox:local}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
say() { echo "build-local: $* ($SECONDS s)"; }

if ! "$engine" "${engine_args[@]}" image inspect "$base" >/dev/null 2>&1; then
    root=$(mktemp -d)
    trap 'rm -rf "$root"' EXIT
    say "debootstrap bookworm into $root"
    debootstrap --variant=minbase --include=python3,ca-certificates \
        bookworm "$root" "$mirror" >/dev/null
    tar -C "$root" -c . | "$engine" "${engine_args[@]}" import - "$base" >/dev/null
    rm -rf "$root"
    trap - EXIT
    say "imported $base"
fi

# The binaries go into the build context (container/prebuilt: .gitignored,
# not .dockerignored), where the Containerfile's PREBUILT takes them.
bins=${CELLBOX_BINARIES:-}
if [ -z "$bins" ]; then
    cargo build --release --locked --bin cellbox --bin cellbox-engine
    # .cargo/config.toml builds for the host's target explicitly.
    bins=target/$(rustc -vV | sed -n 's/^host: //p')/release
fi
rm -rf container/prebuilt
install -D -m 0755 -t container/prebuilt "$bins/cellbox" "$bins/cellbox-engine"
say "binaries from $bins"

"$engine" "${engine_args[@]}" build -q -f Containerfile -t "$image" \
    --build-arg BUILDER="$base" --build-arg BASE="$base" \
    --build-arg PREBUILT=container/prebuilt . >/dev/null
rm -rf container/prebuilt
say "built $image"

# docs/containers.md: the seccomp profile, AppArmor unconfined, /proc
# unmasked (Docker: systempaths=unconfined; Podman: unmask=ALL), a private
# cgroup namespace; the image's non-root user.
if [ "$engine" = podman ]; then unmask=unmask=ALL; else unmask=systempaths=unconfined; fi
run=("$engine" "${engine_args[@]}" run --rm -i
    --security-opt seccomp=container/seccomp.json
    --security-opt apparmor=unconfined
    --security-opt "$unmask"
    --cgroupns=private
    "${run_args[@]}"
    "$image")
"${run[@]}" doctor
py=$(echo 'print(6 * 7)' | "${run[@]}" run --lang python -)
rhai=$(echo '40 + 2' | "${run[@]}" run --lang rhai -)
[ "$py" = 42 ] || { echo "build-local: the Python cell printed: $py" >&2; exit 1; }
[ "$rhai" = 42 ] || { echo "build-local: the Rhai cell printed: $rhai" >&2; exit 1; }
say "PASS: doctor, a Python cell and a Rhai cell in $image"
