#!/usr/bin/env bash
# Installs what nodus's tests and demo need, from Debian's packages only.
# Idempotent: packages already present are skipped without touching the network.
set -euo pipefail

# OCI runtimes (runsc: gVisor, the RuntimeClass lesson's sandboxed handler); CNI plugins; kube-proxy backends; busybox-static for offline test images;
# a real OCI registry; containerd (second CRI runtime and benchmark peer); independent OCI
# archive checkers; etcd; netns/mount tools; hyperfine for benchmarks.
PACKAGES=(
  runc crun runsc
  containernetworking-plugins
  nftables iptables conntrack
  busybox-static
  docker-registry
  containerd
  skopeo umoci
  etcd-server
  iproute2 util-linux procps
  hyperfine
  # an upstream DNS server for the cluster DNS forwarding test
  nsd
  # the VM lane (scripts/vm-test.sh): a cgroup v2 + systemd guest built from Debian's packages
  qemu-system-x86 qemu-utils debootstrap e2fsprogs
)

missing=()
# kubectl ships with this machine kind; Debian's kubernetes-client provides it elsewhere.
if ! command -v kubectl >/dev/null 2>&1; then
  PACKAGES+=(kubernetes-client)
fi
for p in "${PACKAGES[@]}"; do
  [[ $p == \#* ]] && continue
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: must run as root to install packages" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Package scripts must not start daemons on this machine: tests start their own.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Debian's packages start nothing without systemd, but be sure no packaged daemon holds
# the default sockets or ports the tests would otherwise share.
for bin in /usr/bin/containerd /usr/bin/docker-registry; do
  if pids=$(pgrep -x -f "$bin" 2>/dev/null); then
    echo "setup: note: $bin already running as pid(s) $pids (left alone; tests use private instances)"
  fi
done
echo "setup: ok"
