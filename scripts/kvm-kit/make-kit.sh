#!/bin/sh
# Gather what scripts/kvm-kit/run.py needs on a bare KVM host that has no QEMU
# and no network (a lent device machine): this host's QEMU with every library
# it links and its own loader, the firmware it reads, hpvc's guest kernel, an
# initramfs whose /init is native/bench/kvmguest.c built static, the same
# program for the host side, and the qemu.qmp package hpvc's migration code
# uses. Into build/kvmkit, packed as build/kvmkit.tar.gz (git-ignored; the
# packed kit is what travels to the device: under its 64 MiB).
# Usage: scripts/kvm-kit/make-kit.sh [KERNEL]  (default: the newest guest
# kernel hpvc fetched under /var/lib/hpvc/images/guest).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
kit=$root/build/kvmkit
kernel=${1:-$(ls -td /var/lib/hpvc/images/guest/*/vmlinuz 2>/dev/null | head -n1)}
[ -n "$kernel" ] && [ -f "$kernel" ] || {
	echo "make-kit: no guest kernel; run 'make demo' once (it fetches one) or give its path" >&2
	exit 2
}
qemu=$(command -v qemu-system-x86_64) || { echo "make-kit: qemu-system-x86_64 missing: run scripts/setup.sh" >&2; exit 2; }
rm -rf "$kit"
mkdir -p "$kit/lib" "$kit/fw" "$kit/py" "$kit/initrd/dev" "$kit/initrd/proc" "$kit/initrd/sys"
cp "$qemu" "$kit/qemu-system-x86_64"
ldd "$qemu" | awk '/=> \//{print $3} /^\t\/lib/{print $1}' | while read -r lib; do
	cp -L "$lib" "$kit/lib/"
done
mkdir -p "$kit/modules"  # TCG is a module in Debian's QEMU (for a run without KVM)
cp /usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so "$kit/modules/"
for f in bios-256k.bin kvmvapic.bin linuxboot_dma.bin; do
	cp -L "$(ls /usr/share/qemu/$f /usr/share/seabios/$f 2>/dev/null | head -n1)" "$kit/fw/"
done
cp "$kernel" "$kit/vmlinuz"
cc -O2 -Wall -Wextra -Werror -static -pthread -o "$kit/kvmguest" "$root/native/bench/kvmguest.c"
cp "$kit/kvmguest" "$kit/initrd/init"
(cd "$kit/initrd" && find . | cpio -o -H newc --quiet | gzip -1) > "$kit/initrd.img"
rm -rf "$kit/initrd"
qmp=$("$root/.venv/bin/python" -c 'import qemu.qmp, os; print(os.path.dirname(qemu.qmp.__file__))')
mkdir -p "$kit/py/qemu" && cp -r "$qmp" "$kit/py/qemu/" && touch "$kit/py/qemu/__init__.py"
find "$kit/py" -name __pycache__ -prune -exec rm -rf {} +
tar -C "$root/build" -czf "$root/build/kvmkit.tar.gz" kvmkit
du -sh "$kit" "$root/build/kvmkit.tar.gz"
