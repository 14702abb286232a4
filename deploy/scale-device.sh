#!/usr/bin/env bash
# The real-geometry scale rig on the device machine (docs/PERFORMANCE.md, "Real-geometry scale
# rig"; bench/scale/run_scale.sh).
#
#   bash deploy/scale-device.sh --pack DEST   # here: ckpt-audit, ckpt-scale-gen (stripped),
#                                             # their shared libraries, run_scale.sh,
#                                             # run_parts.sh and this script into DEST (an
#                                             # ignored folder that the device call carries)
#   bash DEST/scale-device.sh [RUN_SCALE ARGS]  # there: run_scale.sh, results into $OUT
#
# The device has no Debian packages, so the Abseil/OpenSSL/libstdc++ libraries travel in
# DEST/lib, as deploy/device-run.sh does for its binaries.
set -uo pipefail

if [ "${1:-}" = "--pack" ]; then
  dest=${2:?--pack DEST}
  build=${BUILD_DIR:-$(cd "$(dirname "$0")/.." && pwd)/build}
  rm -rf "$dest" && mkdir -p "$dest/bin" "$dest/lib"
  for b in services/cli/ckpt-audit bench/scale/ckpt-scale-gen; do
    strip -o "$dest/bin/$(basename "$b")" "$build/$b" || exit 2
  done
  ldd "$dest"/bin/* | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libgcc_s|ld-linux[^/]*)\.so' | xargs -r -I{} cp -L {} "$dest/lib/"
  cp "$(dirname "$0")/../bench/scale/run_scale.sh" "$(dirname "$0")/../bench/scale/run_parts.sh" "$0" "$dest/"
  du -sh "$dest"
  exit 0
fi

here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib"
OUT=${OUT:-/tmp/scale-out}
# The work directory goes on whichever candidate file system has the most free space.
work=${SCALE_WORK:-}
if [ -z "$work" ]; then
  best=0
  for d in "$PWD" /root /tmp /var/tmp; do
    avail=$(df -Pk "$d" 2>/dev/null | awk 'NR == 2 {print $4}')
    if [ -n "$avail" ] && [ "$avail" -gt "$best" ]; then best=$avail work=$d/scale-work; fi
  done
fi
bash "$here/run_scale.sh" --dir "$work" --bin "$here/bin" --results "$OUT" "$@"
