#!/usr/bin/env bash
# Runs inside the VM lane's guest (scripts/vm-test.sh boots it): the tests that need a real
# cgroup v2 host with systemd and logind. stdout/stderr and the exit status go back to the
# host; the guest powers off afterwards.
#
#   vm-suite.sh OUT-DIR [TEST...]
#
# A TEST is `<crate dir>/<target>[/<filter>]` from OUT-DIR/executables (written by the host,
# which has cargo); without any, the lane's default list below runs.
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1
shift

DEFAULT_TESTS=(
  # the cgroup driver's own tests against the real v2 tree
  cgroups/nodus_cgroups
  # the lesson's lab steps 5 and 6: QoS tiers, limits, throttling, OOMKilled, allocatable
  nodus/kubelet_qos
  # the systemd cgroup driver: kubelet --cgroup-driver systemd, runtime systemd-cgroup
  nodus/kubelet_systemd
)

echo "suite: kernel $(uname -r), $(stat -fc %T /sys/fs/cgroup) at /sys/fs/cgroup"
echo "suite: controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
echo "suite: $(systemctl --version | head -1); logind $(systemctl is-active systemd-logind)"
if [[ $(stat -fc %T /sys/fs/cgroup) != cgroup2fs ]]; then
  echo "suite: FAIL: the guest is not a cgroup v2 host" >&2
  exit 1
fi

export NODUS_TEST_REQUIRE_ROOT=1
# Test binaries read assets relative to the repository, as under cargo.
export RUST_BACKTRACE=1

failed=()
run_one() {
  local spec=$1 crate target filter exe start rc
  IFS=/ read -r crate target filter <<< "$spec"
  exe=$(awk -v c="$crate" -v t="$target" '$1 == c && $3 == t {print $4; exit}' "$out/executables")
  if [[ -z $exe ]]; then
    echo "suite: FAIL: no test executable $crate/$target"
    failed+=("$spec")
    return
  fi
  echo "suite: test $spec: start"
  start=$SECONDS
  # cargo runs a package's tests from its directory.
  (cd "crates/$crate" && "$exe" --test-threads 2 ${filter:+"$filter"}) && rc=0 || rc=$?
  echo "suite: test $spec: exit $rc, $((SECONDS - start)) s"
  ((rc == 0)) || failed+=("$spec")
}

tests=("$@")
((${#tests[@]})) || tests=("${DEFAULT_TESTS[@]}")
for t in "${tests[@]}"; do
  run_one "$t"
done
if ((${#failed[@]})); then
  echo "suite: FAILED: ${failed[*]}"
  exit 1
fi
echo "suite: all ${#tests[@]} passed"
