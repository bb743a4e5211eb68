#!/usr/bin/env bash
# The kernel the cgroup v2 test VM boots (tests/vm.rs): Debian's newest
# bookworm-backports kernel (Landlock ABI 6; bookworm's own 6.1 has ABI 2),
# unpacked rather than installed (no initramfs rebuild, nothing in /boot),
# its vmlinuz and the modules the VM's init loads, decompressed, under
# target/vm/kernel. Needs bookworm-backports among apt's sources (.ci/run
# adds it) and xz.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=target/vm/kernel
pkg=$(apt-cache depends -t bookworm-backports linux-image-amd64 |
    awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
if [ -z "$pkg" ]; then
    echo "fetch-kernel: no linux-image-amd64 in bookworm-backports (is it among apt's sources?)" >&2
    exit 1
fi
if [ -f "$out/package" ] && [ "$(cat "$out/package")" = "$pkg" ] && [ -f "$out/vmlinuz" ]; then
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -q -t bookworm-backports "$pkg" >/dev/null 2>&1)
dpkg-deb -x "$work"/*.deb "$work/x"
rm -rf "$out"
mkdir -p "$out/modules"
cp "$work"/x/boot/vmlinuz-* "$out/vmlinuz"
for m in fs/netfs/netfs net/9p/9pnet net/9p/9pnet_virtio fs/9p/9p fs/overlayfs/overlay; do
    xz -dc "$work"/x/lib/modules/*/kernel/$m.ko.xz > "$out/modules/${m##*/}.ko"
done
echo "$pkg" > "$out/package"
echo "fetch-kernel: $pkg in $out"
