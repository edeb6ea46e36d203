#!/usr/bin/env bash
# The VM test lane: runs nodus's cgroup v2 + systemd suite (scripts/vm-suite.sh) inside a
# Debian bookworm guest booted under qemu, because this host is cgroup v1 without systemd
# and most real nodes are the opposite.
#
#   bash scripts/vm-test.sh [SUITE-ARGS...]
#
# The guest image is built once from Debian's packages with debootstrap (the mirror is
# read from apt's own sources on this machine) and cached under $NODUS_VM_CACHE
# (/var/cache/nodus-vm); after that the lane is offline. Each run boots a copy-on-write
# overlay of the image, so runs never see each other's state. The guest has no network
# device (-nic none): the repository and the cargo target dir are shared into it over
# virtio-9p at the same paths as on the host, so test binaries find the nodus binary and
# test assets where cargo put them. The suite's log and exit status come back through
# the shared target dir; the guest's console is kept beside them.
#
# Needs root, qemu-system-x86, debootstrap and e2fsprogs (scripts/setup.sh installs them),
# and a built workspace (cargo build --workspace --all-targets).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
TARGET=${CARGO_TARGET_DIR:-$REPO/target}
TARGET=$(cd "$TARGET" && pwd)
CACHE=${NODUS_VM_CACHE:-/var/cache/nodus-vm}
# Software emulation: with KVM on these machines a guest hangs before the kernel prints.
ACCEL=${NODUS_VM_ACCEL:-tcg}
MEM=${NODUS_VM_MEM:-4096}
TIMEOUT=${NODUS_VM_TIMEOUT:-2400}

# Packages of the guest. Changing this list (or the configuration below) changes the image
# key, so a stale cached image is never used.
GUEST_PACKAGES=(
  systemd systemd-sysv dbus udev kmod libpam-systemd
  linux-image-amd64 initramfs-tools
  runc crun containernetworking-plugins containerd
  busybox-static docker-registry etcd-server
  iproute2 nftables iptables procps util-linux ca-certificates
)
IMAGE_VERSION=1

log() { echo "vm-test: $*"; }

# The first Debian mirror apt on this machine uses, from deb822 or one-line sources.
apt_mirror() {
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    uri=$(awk '/^URIs:/ {print $2; exit}' "$f")
    if [[ -n $uri ]] && grep -q '^Suites:.*bookworm' "$f"; then
      echo "$uri"
      return
    fi
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    uri=$(awk '$1 == "deb" && $0 ~ /bookworm/ {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' "$f")
    if [[ -n $uri ]]; then
      echo "$uri"
      return
    fi
  done
  echo "vm-test: no bookworm mirror found in apt's sources under /etc/apt" >&2
  return 1
}

# Writes the guest's own configuration into a debootstrapped root.
configure_guest() {
  local root=$1
  echo nodus-vm > "$root/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 nodus-vm\n' > "$root/etc/hosts"
  echo '/dev/vda / ext4 rw,relatime 0 1' > "$root/etc/fstab"
  # The initramfs needs only what finds the root disk (the 9p modules load on mount); a
  # small one unpacks faster under emulation.
  printf 'virtio_pci\nvirtio_blk\next4\n' >> "$root/etc/initramfs-tools/modules"
  sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
  chroot "$root" update-initramfs -u -k all >/dev/null
  # Nothing of the guest's own starts containers or registries: tests start private ones.
  chroot "$root" systemctl disable containerd.service docker-registry.service \
    >/dev/null 2>&1 || true
  chroot "$root" systemctl mask getty@tty1.service serial-getty@ttyS0.service \
    systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer \
    >/dev/null 2>&1 || true
  cat > "$root/usr/local/sbin/nodus-vm-entry" <<'EOF'
#!/bin/bash
# Mounts the host's shares at their host paths, runs the suite, records its status,
# powers off. Its arguments come from the kernel command line (nodus.*=).
set -u
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^nodus\.$1=//p" | head -1; }
repo=$(arg repo); target=$(arg target); out=$(arg out); suite_args=$(arg args)
mkdir -p "$repo"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,cache=loose repo "$repo"
if [[ $target != "$repo"/* ]]; then
  mkdir -p "$target"
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,cache=loose target "$target"
fi
mkdir -p "$out"
# shellcheck disable=SC2086
bash "$repo/scripts/vm-suite.sh" "$out" ${suite_args//,/ } > "$out/suite.log" 2>&1
echo $? > "$out/status"
sync
systemctl poweroff --no-block
EOF
  chmod 0755 "$root/usr/local/sbin/nodus-vm-entry"
  cat > "$root/etc/systemd/system/nodus-vm-suite.service" <<'EOF'
[Unit]
Description=nodus VM test suite
After=local-fs.target dbus.service systemd-logind.service
Wants=dbus.service systemd-logind.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/nodus-vm-entry
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
EOF
  chroot "$root" systemctl enable nodus-vm-suite.service >/dev/null 2>&1
  # etcd is there for `nodus up`'s static pod, not as a service of its own.
  chroot "$root" systemctl disable etcd.service >/dev/null 2>&1 || true
  # Journals of the guest help when a run fails; keep them in memory only.
  mkdir -p "$root/etc/systemd/journald.conf.d"
  printf '[Journal]\nStorage=volatile\n' > "$root/etc/systemd/journald.conf.d/volatile.conf"
}

build_image() {
  local key=$1 dir=$CACHE/$key
  if [[ -f $dir/image.raw && -f $dir/vmlinuz && -f $dir/initrd.img ]]; then
    return
  fi
  local mirror root start=$SECONDS
  mirror=$(apt_mirror)
  root=$CACHE/build-$$
  rm -rf "$root"
  mkdir -p "$root"
  # A RETURN trap stays set after it fires (and would fire again when main returns, with
  # $root gone), and under errexit a failing umount (3: nothing mounted any more) would end
  # the lane: so it tolerates that and removes itself.
  trap 'umount -R "$root/proc" "$root/sys" "$root/dev" 2>/dev/null || true; rm -rf "$root"; trap - RETURN' RETURN
  log "building the guest image (debootstrap bookworm, $(IFS=,; echo "${GUEST_PACKAGES[*]}"))"
  local pkgs
  pkgs=$(IFS=,; echo "${GUEST_PACKAGES[*]}")
  if ! debootstrap --variant=minbase --include="$pkgs" bookworm "$root" "$mirror" \
    > "$CACHE/debootstrap.log" 2>&1; then
    tail -20 "$CACHE/debootstrap.log" >&2
    return 1
  fi
  configure_guest "$root"
  mkdir -p "$dir.tmp"
  cp "$root"/boot/vmlinuz-* "$dir.tmp/vmlinuz"
  cp "$root"/boot/initrd.img-* "$dir.tmp/initrd.img"
  rm -rf "$root/var/cache/apt/archives"/*.deb
  mkfs.ext4 -q -F -L nodusvm -d "$root" "$dir.tmp/image.raw" 6G
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
  log "guest image built in $((SECONDS - start)) s: $dir"
}

main() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "vm-test: needs root (debootstrap, qemu with virtio-9p)" >&2
    exit 1
  fi
  for tool in qemu-system-x86_64 debootstrap mkfs.ext4 qemu-img; do
    command -v "$tool" >/dev/null || { echo "vm-test: $tool not found (scripts/setup.sh)" >&2; exit 1; }
  done
  mkdir -p "$CACHE"
  local key
  key=$( { echo "$IMAGE_VERSION"; printf '%s\n' "${GUEST_PACKAGES[@]}"; declare -f configure_guest; } \
    | sha256sum | cut -c1-16)
  build_image "$key"
  local img=$CACHE/$key run out
  run=$(date +%Y%m%d-%H%M%S)-$$
  out=$TARGET/vm-test/$run
  mkdir -p "$out"
  # The guest has no cargo: name every test executable of the workspace for it, as
  # "<crate dir> <kind> <target> <path>" lines (built already, so this only lists them).
  cargo test --workspace --no-run --locked --message-format=json 2>/dev/null \
    | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        pkg = m["manifest_path"].rsplit("/", 2)[-2]
        t = m["target"]
        print(pkg, t["kind"][0], t["name"], m["executable"])
' > "$out/executables"
  log "$(wc -l < "$out/executables") test executables listed for the guest"
  # Host tools the tests drive that the guest's packages lack (kubectl is one static
  # binary), on the guest's PATH through the share.
  mkdir -p "$out/bin"
  for tool in kubectl; do
    if command -v "$tool" >/dev/null; then
      cp "$(command -v "$tool")" "$out/bin/"
    fi
  done
  qemu-img create -q -f qcow2 -b "$img/image.raw" -F raw "$out/disk.qcow2"
  local args
  args=$(IFS=,; echo "$*")
  local append="console=ttyS0 root=/dev/vda rw quiet nodus.repo=$REPO nodus.target=$TARGET"
  append+=" nodus.out=$out"
  [[ -n $args ]] && append+=" nodus.args=$args"
  local shares=(
    -virtfs "local,path=$REPO,mount_tag=repo,security_model=none,id=repo"
  )
  if [[ $TARGET != "$REPO"/* ]]; then
    shares+=(-virtfs "local,path=$TARGET,mount_tag=target,security_model=none,id=target")
  fi
  log "booting (accel $ACCEL, ${MEM} MiB, timeout ${TIMEOUT} s); console: $out/console.log"
  local start=$SECONDS rc=0
  timeout --kill-after=10 "$TIMEOUT" qemu-system-x86_64 \
    -accel "$ACCEL" -machine q35 -cpu max -smp "$(nproc)" -m "$MEM" \
    -nic none -nographic -no-reboot \
    -serial "file:$out/console.log" -monitor none \
    -kernel "$img/vmlinuz" -initrd "$img/initrd.img" -append "$append" \
    -drive "file=$out/disk.qcow2,if=virtio,format=qcow2,cache=unsafe" \
    "${shares[@]}" || rc=$?
  rm -f "$out/disk.qcow2"
  log "guest ran $((SECONDS - start)) s (qemu exit $rc)"
  if [[ -f $out/suite.log ]]; then
    sed 's/^/vm| /' "$out/suite.log"
  fi
  if [[ ! -f $out/status ]]; then
    echo "vm-test: the suite did not finish (qemu exit $rc); last console lines:" >&2
    tail -40 "$out/console.log" >&2 || true
    exit 1
  fi
  local status
  status=$(cat "$out/status")
  # The guest's poweroff was the graceful-shutdown test: check what its pods left.
  if [[ -f $out/shutdown/armed ]]; then
    local exe
    exe=$(awk '$1 == "nodus" && $3 == "node_shutdown" {print $4; exit}' "$out/executables")
    log "verifying the graceful node shutdown the guest went through"
    if ! (cd crates/nodus && NODUS_VM_SHUTDOWN_DIR=$out/shutdown \
      "$exe" --ignored --exact graceful_shutdown_2_verify); then
      status=1
    fi
  fi
  log "suite exit status $status; logs in $out"
  exit "$status"
}

main "$@"
