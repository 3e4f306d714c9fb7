#!/bin/sh
# EFA hardware counters as node exporter textfile metrics (docs/observability.md, "EFA").
#
# Runs as a sidecar of kube-prometheus-stack's node exporter DaemonSet, in the node exporter image itself
# (prometheus/node_exporter v1.12.1 Dockerfile: FROM quay.io/prometheus/busybox, itself FROM busybox:glibc in
# prometheus/busybox glibc/Dockerfile, so /bin/sh is busybox ash, with readlink, sleep, mv and rm), and in
# tests/test_efa_counters.py (Debian's dash) against a fake sysfs tree. POSIX sh only.
#
# The EFA driver exposes its per-port byte and packet counters only as rdma-core hw_counters:
# /sys/class/infiniband/<dev>/ports/<port>/hw_counters/<name> (amzn-drivers efa_linux_3.1.0,
# kernel/linux/efa/src/efa_verbs.c EFA_DEFINE_PORT_STATS: tx_bytes, rx_bytes, rdma_read_bytes,
# rdma_write_bytes, ...), one decimal number per file, world-readable (drivers/infiniband/core/sysfs.c
# alloc_hsa: S_IRUGO), besides `lifespan` (the cache time in ms, not a counter). Node exporter's infiniband
# collector does not read them (prometheus/procfs v0.21.1 sysfs/class_infiniband.go knows only mlx5's
# hw_counters names), so this script writes them, for the devices bound to the `efa` driver, as
#   node_efa_hw_counter_total{device="rdmap16s27",port="1",counter="tx_bytes"} 123
# into a .prom file of node exporter's textfile directory: written to a temporary name first and renamed, so a
# scrape never reads half a file (node_exporter collector/textfile.go reads only names ending in .prom).
#
# Environment: EFA_SYSFS (the host's /sys; default /sys), EFA_TEXTFILE_DIR (required), EFA_INTERVAL_S (seconds
# between writes, 1 to 3600; default 15). `--once` writes once and exits (the tests). Exit 2 on a bad setting.
set -u

sysfs=${EFA_SYSFS:-/sys}
out_dir=${EFA_TEXTFILE_DIR:-}
interval=${EFA_INTERVAL_S-15}
metric=node_efa_hw_counter_total

fail() { echo "efa-counters: $*" >&2; exit 2; }

[ -n "$out_dir" ] || fail "EFA_TEXTFILE_DIR is not set: set it to node exporter's --collector.textfile.directory"
[ -d "$out_dir" ] && [ -w "$out_dir" ] || fail "EFA_TEXTFILE_DIR=$out_dir is not a writable directory"
case $interval in
  ''|*[!0-9]*) fail "EFA_INTERVAL_S=$interval is not a whole number of seconds (1 to 3600)" ;;
esac
[ "$interval" -ge 1 ] && [ "$interval" -le 3600 ] || fail "EFA_INTERVAL_S=$interval is outside 1 to 3600 seconds"

# The series of every port of every EFA device, on stdout.
counters() {
  echo "# HELP $metric EFA port hardware counter (sysfs class/infiniband/<device>/ports/<port>/hw_counters/<counter>)."
  echo "# TYPE $metric counter"
  for dev_dir in "$sysfs"/class/infiniband/*; do
    [ -d "$dev_dir/ports" ] || continue
    driver=$(readlink "$dev_dir/device/driver" 2>/dev/null) || continue
    [ "${driver##*/}" = efa ] || continue
    device=${dev_dir##*/}
    case $device in *[!A-Za-z0-9_.:-]*) continue ;; esac
    for hw_dir in "$dev_dir"/ports/*/hw_counters; do
      [ -d "$hw_dir" ] || continue
      port=${hw_dir%/hw_counters}
      port=${port##*/}
      case $port in ''|*[!0-9]*) continue ;; esac
      for file in "$hw_dir"/*; do
        counter=${file##*/}
        [ "$counter" != lifespan ] && [ -f "$file" ] || continue
        case $counter in ''|*[!a-z0-9_]*) continue ;; esac
        value=
        read -r value 2>/dev/null < "$file"
        case $value in ''|*[!0-9]*) continue ;; esac
        echo "$metric{device=\"$device\",port=\"$port\",counter=\"$counter\"} $value"
      done
    done
  done
}

write() {
  tmp="$out_dir/.efa.prom.tmp"
  if counters > "$tmp"; then
    mv -f "$tmp" "$out_dir/efa.prom"
  else
    rm -f "$tmp"
    echo "efa-counters: could not write $tmp" >&2
  fi
}

if [ "${1:-}" = --once ]; then
  write
  exit 0
fi

# As the pod's sidecar: stop at once on SIGTERM (the shell is the container's PID 1, which ignores signals it has
# no trap for; sleep runs in the background so the trap fires during it, and is stopped with it).
sleeper=
trap '[ -z "$sleeper" ] || kill "$sleeper" 2>/dev/null; exit 0' TERM INT
while :; do
  write
  sleep "$interval" &
  sleeper=$!
  wait "$sleeper"
done
