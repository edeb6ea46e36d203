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
# Under emulation a control plane's TLS handshakes outlast kubectl's 10 s timeout, so the
# lane keeps to node-level tests; the API-facing ones run on the host.
out=$1
shift

DEFAULT_TESTS=(
  # the cgroup driver's own tests against the real v2 tree
  cgroups/nodus_cgroups
  # the lesson's lab steps 5 and 6: QoS tiers, limits, throttling, OOMKilled, allocatable
  nodus/kubelet_qos
  # the systemd cgroup driver: kubelet --cgroup-driver systemd, runtime systemd-cgroup
  nodus/kubelet_systemd
  # OOMKilled in privileged pods, which have no cgroup namespace on v2 (issue 20)
  nodus/runtime_conformance/oom
  # the runtime's own unit tests (overlay mounts, specs) on the guest's kernel
  runtime/nodus_runtime
  # crun as a RuntimeClass handler: lifecycle, logs, exec, OOMKilled (it refuses v1 hosts)
  nodus/runtime_handlers
  # the shipped unit files: Type=notify readiness, journal, pods kept across restarts
  nodus/systemd_units
  # last: leaves pods running under a kubelet holding logind's delay lock; the guest's
  # poweroff afterwards is the test (scripts/vm-test.sh verifies it from the host)
  nodus/node_shutdown/graceful_shutdown_1_arm
)

echo "suite: kernel $(uname -r), $(stat -fc %T /sys/fs/cgroup) at /sys/fs/cgroup"
echo "suite: controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
echo "suite: $(systemctl --version | head -1); logind $(systemctl is-active systemd-logind)"
if [[ $(stat -fc %T /sys/fs/cgroup) != cgroup2fs ]]; then
  echo "suite: FAIL: the guest is not a cgroup v2 host" >&2
  exit 1
fi

export NODUS_TEST_REQUIRE_ROOT=1
export PATH="$out/bin:$PATH"
export NODUS_VM_SHUTDOWN_DIR=$out/shutdown
# Test binaries read assets relative to the repository, as under cargo.
export RUST_BACKTRACE=1

failed=()
# `bench/<bin>`: a benchmark binary of bench/ (the debug build beside the tests) run in
# the guest, writing its section of docs/PERFORMANCE.md through the share.
run_bench() {
  local bin=$1 debug start rc
  debug=$(dirname "$(dirname "$(awk 'NR == 1 {print $4}' "$out/executables")")")
  echo "suite: bench $bin: start"
  start=$SECONDS
  NODUS_BIN=$debug/nodus BENCH_HANDLERS=runc,crun BENCH_PODS=${BENCH_PODS:-10} \
    "$debug/$bin" --write docs/PERFORMANCE.md && rc=0 || rc=$?
  echo "suite: bench $bin: exit $rc, $((SECONDS - start)) s"
  ((rc == 0)) || failed+=("bench/$bin")
}

run_one() {
  local spec=$1 crate target filter exe start rc
  if [[ $spec == bench/* ]]; then
    run_bench "${spec#bench/}"
    return
  fi
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
  # A filter names tests explicitly, so ignored ones among them (those that need this
  # guest) run too.
  (cd "crates/$crate" && "$exe" --test-threads 2 ${filter:+--include-ignored "$filter"}) \
    && rc=0 || rc=$?
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
