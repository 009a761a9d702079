#!/usr/bin/env bash
# Sourced by the ncu scripts (decode_ncu.sh, peer_ncu.sh): known_metrics DIR NAMES... prints the
# NAMES this ncu knows (queried for gh100 into DIR/metrics.txt, or for the local GPU), each as
# NAME.sum, comma-joined for --metrics; empty when none is known. ncu versions rename and drop
# metrics, and one unknown name makes ncu refuse the whole list.
known_metrics() {
  local dir=$1 m="" x
  shift
  ncu --query-metrics --chip gh100 > "$dir/metrics.txt" 2>&1 || ncu --query-metrics > "$dir/metrics.txt" 2>&1
  for x in "$@"; do grep -q "^$x " "$dir/metrics.txt" && m="$m,$x.sum"; done
  echo "${m#,}"
}
