#!/usr/bin/env bash
# What the node's mount table costs runc, and what nodus's layout of it saves.
#
# runc reads /proc/self/mountinfo four times per container it starts (twice in `runc run`,
# twice in its init), and the kernel renders every line of the table each time. This builds
# a hundred pods' worth of the mounts a nodus node holds (three namespace pins, /dev/shm, the
# overlay root of a two-layer image, the service-account token's tmpfs) in a private mount
# namespace, in four layouts, and times `runc run --detach` of a busybox container on top:
#   full IDs   the layout before 2026-12-06: 64-digit IDs in every path, overlay layers as
#              absolute paths
#   relative   overlay layers relative to the container's layer directory
#   short IDs  that, and sandbox and container directories named by 16 digits of their IDs
#   podns      the layout since 2026-12-07: each pod's shm and overlay in a mount namespace
#              of the pod's own, pinned in a private directory; the node keeps the pins
#              and the tokens' tmpfs, and runc runs in a pod's namespace, made as nodus
#              makes it (a slave copy of the node's, the sandboxes' mount point detached)
#   none       no pod mounts at all (the table of an empty node)
# Rounds alternate the layouts, so the machine's drift spreads over all of them.
# CPU: `runc run`'s own (user + system, from the shell's `time`) and its init's (the
# container's cpuacct.usage once `runc run --detach` has returned: the init until it execs).
#
#   bash bench/mount-table.sh [--write docs/PERFORMANCE.md]
set -euo pipefail
cd "$(dirname "$0")/.."
WRITE=""
if [ "${1:-}" = "--write" ]; then WRITE=$2; fi
PODS=${PODS:-100}
RUNS=${RUNS:-30}
ROUNDS=${ROUNDS:-4}
command -v runc >/dev/null || { echo "mount-table: runc is not installed" >&2; exit 1; }
[ -x /bin/busybox ] || { echo "mount-table: /bin/busybox (busybox-static) is not installed" >&2; exit 1; }
CPUACCT=$(awk '$9 == "cgroup" && $NF ~ /(^|,)cpuacct(,|$)/ {print $5; exit}' /proc/self/mountinfo)
[ -n "$CPUACCT" ] || { echo "mount-table: needs a cgroup v1 cpuacct hierarchy (runc's init CPU is read from it)" >&2; exit 1; }

# One layout, in a mount namespace of its own (everything mounted goes with it).
one() {
  local layout=$1 out=$2
  unshare -m --propagation private bash -s "$layout" "$PODS" "$RUNS" "$CPUACCT" > "$out" <<'EOS'
set -euo pipefail
layout=$1; pods=$2; runs=$3; cpuacct=$4
base=$(mktemp -d /tmp/mount-table.XXXXXX)
mount -t tmpfs mount-table "$base"
cg=mount-table-$$
cleanup() {
  for i in $(seq "$runs"); do runc --root "$base/runc" delete -f "c$i" >/dev/null 2>&1 || true; done
  for d in /sys/fs/cgroup/*/"$cg"; do [ -d "$d" ] && rmdir "$d"/c "$d" 2>/dev/null || true; done
  umount -R "$base" 2>/dev/null || umount -l "$base"
  rmdir "$base"
}
trap cleanup EXIT
# Paths as long as a benchmark node's (a temp dir, then state/ and root/).
node=$base/bench-nodus-AaK6WO; state=$node/state; root=$node/root
hex() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
l1=$(hex); l2=$(hex)
mkdir -p "$root/snapshots/sha256/$l1/fs" "$root/snapshots/sha256/$l2/fs"
if [ "$layout" = podns ]; then
  # The sandboxes' shared mount point and the private directory of the pods' mount
  # namespace pins, as the runtime makes them at start.
  mkdir -p "$state/sandboxes" "$state/mntns"
  mount --bind "$state/sandboxes" "$state/sandboxes"
  mount --make-private "$state/sandboxes"; mount --make-shared "$state/sandboxes"
  mount --bind "$state/mntns" "$state/mntns"; mount --make-private "$state/mntns"
fi
for _ in $(seq "$pods"); do
  [ "$layout" = none ] && break
  sid=$(hex); cid=$(hex)
  if [ "$layout" = full ] || [ "$layout" = relative ]; then sd=$state/sandboxes/$sid; cd=$state/containers/$cid
  else sd=$state/sandboxes/${sid:0:16}; cd=$state/containers/${cid:0:16}; fi
  layer=$root/layers/$cid
  mkdir -p "$sd/ns" "$sd/shm" "$cd/bundle/rootfs" "$layer/upper" "$layer/work"
  for n in net ipc uts; do touch "$sd/ns/$n"; mount --bind "/proc/self/ns/$n" "$sd/ns/$n"; done
  if [ "$layout" = podns ]; then
    # The pod's own namespace, pinned, with its shm and overlay in it.
    pin=$state/mntns/${sid:0:16}; touch "$pin"
    unshare --mount="$pin" --propagation slave sh -c '
      umount -l "$1" && mount -t tmpfs -o nosuid,nodev,noexec,size=65536k shm "$2" &&
      cd "$3" && mount -t overlay none -o "lowerdir=../../snapshots/sha256/$4/fs:../../snapshots/sha256/$5/fs,upperdir=upper,workdir=work" "$6"
    ' _ "$state/sandboxes" "$sd/shm" "$layer" "$l1" "$l2" "$cd/bundle/rootfs"
  else
  mount -t tmpfs -o nosuid,nodev,noexec,size=65536k shm "$sd/shm"
  if [ "$layout" = full ]; then
    mount -t overlay none -o "lowerdir=$root/snapshots/sha256/$l1/fs:$root/snapshots/sha256/$l2/fs,upperdir=$layer/upper,workdir=$layer/work" "$cd/bundle/rootfs"
  else
    (cd "$layer" && mount -t overlay none -o "lowerdir=../../snapshots/sha256/$l1/fs:../../snapshots/sha256/$l2/fs,upperdir=upper,workdir=work" "$cd/bundle/rootfs")
  fi
  fi
  token=$base/bench-api-Gp5Uk8/root/pods/$(cat /proc/sys/kernel/random/uuid)/volumes/kubernetes.io~projected/kube-api-access-ljdkh
  mkdir -p "$token"; mount -t tmpfs tmpfs "$token"
done
# In a pod's own namespace runc runs in a new one made as the runtime makes it: the table
# it reads is that one's.
in_pod() {
  if [ "$layout" = podns ]; then
    unshare -m --propagation slave sh -c 'umount -l "$1"; shift; exec "$@"' _ "$state/sandboxes" "$@"
  else
    "$@"
  fi
}
lines=$(in_pod sh -c 'wc -l < /proc/self/mountinfo'); bytes=$(in_pod sh -c 'wc -c < /proc/self/mountinfo')
b=$base/bundle
mkdir -p "$b/rootfs/bin" "$b/rootfs/proc" "$b/rootfs/sys" "$b/rootfs/dev"
cp /bin/busybox "$b/rootfs/bin/"; ln -s busybox "$b/rootfs/bin/sleep"
(cd "$b" && runc spec && python3 - "$cg" <<'EOP'
import json, sys
s = json.load(open('config.json'))
s['process']['args'] = ['/bin/sleep', '600']
s['process']['terminal'] = False
s['linux']['cgroupsPath'] = '/' + sys.argv[1] + '/c'
json.dump(s, open('config.json', 'w'))
EOP
)
TIMEFORMAT='%U %S'
run_ms=0; init_ns=0
for i in $(seq "$runs"); do
  if [ "$layout" = podns ]; then
    t=$(unshare -m --propagation slave bash -c 'umount -l "$1"; TIMEFORMAT="%U %S"; { time runc --root "$2" run --detach -b "$3" "$4" >/dev/null 2>&1 </dev/null; } 2>&1' _ "$state/sandboxes" "$base/runc" "$b" "c$i")
  else
    t=$( { time runc --root "$base/runc" run --detach -b "$b" "c$i" >/dev/null 2>&1 </dev/null; } 2>&1 )
  fi
  run_ms=$(awk -v a="$run_ms" -v t="$t" 'BEGIN {split(t, x, " "); print a + (x[1] + x[2]) * 1000}')
  init_ns=$((init_ns + $(cat "$cpuacct/$cg/c/cpuacct.usage")))
  runc --root "$base/runc" delete -f "c$i"
done
awk -v l="$lines" -v b="$bytes" -v r="$run_ms" -v i="$init_ns" -v n="$runs" \
  'BEGIN {printf "%d %d %.2f %.2f\n", l, b, r / n, i / n / 1e6}'
EOS
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$ROUNDS"); do
  for layout in full relative short podns none; do
    echo "mount-table: round $r, $layout" >&2
    one "$layout" "$tmp/$layout.$r"
  done
done

table() {
  echo "Measured $(date -u +%Y-%m-%d) on this machine ($(nproc) cores, kernel $(uname -r), $(runc --version | head -1)): $PODS pods' mounts as a nodus node holds them, then $RUNS \`runc run --detach\` of a busybox container per round, $ROUNDS rounds alternating the layouts (\`bash bench/mount-table.sh\`). CPU per container: \`runc run\` itself and its init until it execs the program; the range over the rounds, then their mean."
  echo
  echo "| layout | mount table | runc run | runc init | both | mean | beyond an empty table |"
  echo "| --- | --- | --- | --- | --- | --- | --- |"
  local none_mean
  none_mean=$(cat "$tmp"/none.* | awk '{s += $3 + $4} END {print s / NR}')
  for layout in full relative short podns none; do
    cat "$tmp/$layout".* | awk -v name="$layout" -v none="$none_mean" '
      { l = $1; b += $2; r[NR] = $3; i[NR] = $4; t[NR] = $3 + $4; s += $3 + $4 }
      function range(a,   k, lo, hi) { lo = a[1]; hi = a[1]; for (k in a) { if (a[k] < lo) lo = a[k]; if (a[k] > hi) hi = a[k] } return sprintf("%.1f–%.1f ms", lo, hi) }
      END {
        label["full"] = "full IDs, absolute overlay layers (before)"
        label["relative"] = "overlay layers relative to the layer directory"
        label["short"] = "that, and 16-digit directory names (before 2026-12-07)"
        label["podns"] = "that, each pod with its shm and overlay in a mount namespace of its own and runc in one (now)"
        label["none"] = "no pod mounts"
        printf "| %s | %d lines, %.0f KiB | %s | %s | %s | %.1f ms | %.1f ms |\n", label[name], l, b / NR / 1024, range(r), range(i), range(t), s / NR, s / NR - none
      }'
  done
}
# MOUNT_TABLE_RAW=DIR keeps each round's figures (lines, bytes, runc run ms, init ms).
if [ -n "${MOUNT_TABLE_RAW:-}" ]; then mkdir -p "$MOUNT_TABLE_RAW"; cp "$tmp"/* "$MOUNT_TABLE_RAW"/; fi
out=$(table)
echo "$out"
if [ -n "$WRITE" ]; then
  python3 - "$WRITE" "$out" <<'EOP'
import sys
path, block = sys.argv[1], sys.argv[2]
start, end = "<!-- bench:mount-table:start -->", "<!-- bench:mount-table:end -->"
doc = open(path).read()
if start not in doc:
    sys.exit(f"mount-table: {path} has no {start} marker")
head, rest = doc.split(start, 1)
_, tail = rest.split(end, 1)
open(path, "w").write(f"{head}{start}\n{block}\n{end}{tail}")
EOP
fi
