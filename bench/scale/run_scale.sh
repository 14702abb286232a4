#!/usr/bin/env bash
# The real-geometry scale rig (docs/PERFORMANCE.md, "Real-geometry scale rig").
#
#   bash bench/scale/run_scale.sh --dir WORK [--bin DIR] [--results DIR] [--threads T]
#        [--device cpu|cuda|auto] [--keep] [-- GEN-ARGS...]
#
# GEN-ARGS go to `ckpt-scale-gen gen` (default: --geometry kimi-k3 --layers 1). In WORK it
# generates the MXFP4 source, then measures, each from a cold page cache:
#   gen-src          generating the source (ckpt-scale-gen gen)
#   cp               `cp -r` of the source, then `sync` (its copy is deleted at once: disk)
#   transcode        `ckpt-audit transcode --to nvfp4`; when it succeeds its output is compared
#                    file by file (SHA-256) with the generated NVFP4 tree, then deleted
#   gen-derived      generating the NVFP4 tree (ckpt-scale-gen gen --format nvfp4)
#   cat              `cat` of both trees to /dev/null
#   hash             SHA-256 (OpenSSL) of every file of both trees, T threads
#   inspect          `ckpt-audit inspect` of the first source shard
#   audit-src        `ckpt-audit audit SRC`
#   audit-pair       `ckpt-audit audit DERIVED --source SRC`
#   audit-fwd-cpu    the same with `--forward-layers all --device cpu`
#   audit-fwd-cuda   the same with `--device cuda` (when --device is cuda, or auto and
#                    nvidia-smi works)
#   verify-pair      `ckpt-audit verify-pair`
#   fingerprint-src, fingerprint-derived
#   hash-K, audit-pair-K  with ROUNDS=N (K = 2..N): the baseline and the pair audit again
#   audit-prev-K     with PREV_CLI=PATH (another build's ckpt-audit): its pair audit in every
#                    round (K = 1..N), after the baseline and this build's, to compare builds
# Each line of WORK/../results (or --results) record.jsonl is one command's exit code, wall
# time, peak RSS and storage bytes read/written (ckpt-scale-gen time: wait4 rusage); run.log
# holds every command's output (a refusal's message is there and in summary.txt); summary.txt
# is the table with ratios to the baselines of the same run. A command that fails is reported,
# never skipped silently (SKIP="LABEL ..." skips steps, saying so in run.log). PAIR_WINDOW and
# FWD_WINDOW (e.g. 256M, 1G) give audit-pair and verify-pair, and the audits with the forward,
# that --memory-window. gpt-oss geometries: no NVFP4 tree (formats issue), so only the
# source commands run.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work="" bin="" results="" threads=$(nproc) device=auto keep=0
gen_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) work=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --) shift; gen_args=("$@"); break ;;
    *) echo "run_scale.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$work" ] || { echo "run_scale.sh: --dir WORK is required" >&2; exit 2; }
[ ${#gen_args[@]} -gt 0 ] || gen_args=(--geometry kimi-k3 --layers 1)
if [ -z "$bin" ]; then bin=$(cd "$here/../.." && pwd)/build; fi
gen=$(ls "$bin/ckpt-scale-gen" "$bin/bench/scale/ckpt-scale-gen" 2>/dev/null | head -1)
cli=$(ls "$bin/ckpt-audit" "$bin/services/cli/ckpt-audit" 2>/dev/null | head -1)
[ -x "$gen" ] && [ -x "$cli" ] || { echo "run_scale.sh: no ckpt-scale-gen/ckpt-audit in $bin" >&2; exit 2; }
results=${results:-$work.results}
mkdir -p "$work" "$results"
work=$(cd "$work" && pwd)
src=$work/src der=$work/derived copy=$work/copy tc=$work/transcoded
record=$results/record.jsonl log=$results/run.log
: > "$record"
: > "$log"
export XDG_DATA_HOME=$work/xdg  # transcode and audit sign with the per-user key made here
db=$work/evidence.db
geometry_is_gpt_oss=0
case " ${gen_args[*]} " in *" gpt-oss"*) geometry_is_gpt_oss=1 ;; esac

{
  echo "== machine"; date -u; uname -r; nproc; free -g | head -2; df -h "$work" | tail -1
  grep -m1 'model name' /proc/cpuinfo; nvidia-smi -L 2>/dev/null
  echo "threads $threads; gen args: ${gen_args[*]}"
} >> "$log" 2>&1

cache_note="drop_caches"
drop() {  # cold page cache: the kernel's drop_caches, else per-file fadvise(DONTNEED) via dd
  sync
  if ! { echo 3 > /proc/sys/vm/drop_caches; } 2>/dev/null; then
    cache_note="per-file fadvise DONTNEED (drop_caches not permitted)"
    for d in "$@"; do
      [ -d "$d" ] && find "$d" -type f -exec dd if={} iflag=nocache count=0 status=none \;
    done
  fi
}

run() {  # run LABEL CMD...: cold cache over the existing trees, timed, output into run.log
  local label=$1; shift
  case " ${SKIP:-} " in *" $label "*) echo "== $label: skipped (SKIP=\"$SKIP\")" >> "$log"; return 1 ;; esac
  drop "$src" "$der"
  echo "== $label: $*" >> "$log"
  "$gen" time --label "$label" --record "$record" -- "$@" >> "$log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && echo "   ($label exited $rc)" >> "$log"
  return $rc
}

rm -rf "$src" "$der" "$copy" "$tc" "$work/xdg" "$db" "$db"-* "$db.prev"
run gen-src "$gen" gen "${gen_args[@]}" --format mxfp4 --threads "$threads" --out "$src"
[ -d "$src" ] || { echo "run_scale.sh: generation failed (see $log)" >&2; exit 1; }
run cp sh -c "cp -r '$src' '$copy' && sync"
rm -rf "$copy"

if [ $geometry_is_gpt_oss = 0 ]; then
  if run transcode "$cli" transcode --to nvfp4 "$src" "$tc" --threads "$threads" --db "$db"; then
    "$gen" hash --list --threads "$threads" "$tc" | sed "s|  $tc/|  |" | sort > "$results/transcoded.sha256"
    rm -rf "$tc" "$tc".intoto.jsonl
  fi
  run gen-derived "$gen" gen "${gen_args[@]}" --format nvfp4 --threads "$threads" --out "$der"
  if [ -s "$results/transcoded.sha256" ]; then
    "$gen" hash --list --threads "$threads" "$der" | sed "s|  $der/|  |" | sort > "$results/derived.sha256"
    if cmp -s "$results/transcoded.sha256" "$results/derived.sha256"; then
      echo "transcode output == generated NVFP4 tree (SHA-256 of every file)" >> "$log"
    else
      echo "transcode output DIFFERS from the generated NVFP4 tree" >> "$log"
    fi
  fi
fi
trees=("$src")
[ -d "$der" ] && trees+=("$der")
run cat sh -c "find ${trees[*]} -type f -print0 | xargs -0 cat > /dev/null"
run hash "$gen" hash --threads "$threads" "${trees[@]}"
run inspect "$cli" inspect "$(ls "$src"/*.safetensors | head -1)"
run audit-src "$cli" audit "$src" --threads "$threads" --db "$db"
if [ -d "$der" ]; then
  pair_window=() fwd_window=()
  [ -n "${PAIR_WINDOW:-}" ] && pair_window=(--memory-window "$PAIR_WINDOW")
  [ -n "${FWD_WINDOW:-}" ] && fwd_window=(--memory-window "$FWD_WINDOW")
  run audit-pair "$cli" audit "$der" --source "$src" --threads "$threads" --db "$db" \
    "${pair_window[@]}"
  run audit-fwd-cpu "$cli" audit "$der" --source "$src" --forward-layers all --device cpu \
    --threads "$threads" --db "$db" "${fwd_window[@]}"
  if [ "$device" = cuda ] || { [ "$device" = auto ] && nvidia-smi -L > /dev/null 2>&1; }; then
    run audit-fwd-cuda "$cli" audit "$der" --source "$src" --forward-layers all --device cuda \
      --threads "$threads" --db "$db" "${fwd_window[@]}"
  fi
  run verify-pair "$cli" verify-pair --source "$src" --derived "$der" --threads "$threads" \
    "${pair_window[@]}"
  run fingerprint-derived "$cli" fingerprint "$der" --threads "$threads"
else
  run audit-fwd-cpu "$cli" audit "$src" --forward-layers all --device cpu --threads "$threads" \
    --db "$db"
fi
run fingerprint-src "$cli" fingerprint "$src" --threads "$threads"
# ROUNDS=N: N-1 more rounds of the hashing baseline and the pair audit, alternating, labelled
# hash-K and audit-pair-K: the run-to-run spread of the audit's main ratio.
for k in $(seq 1 "${ROUNDS:-1}"); do
  if [ "$k" -gt 1 ]; then
    run "hash-$k" "$gen" hash --threads "$threads" "${trees[@]}"
    [ -d "$der" ] && run "audit-pair-$k" "$cli" audit "$der" --source "$src" --threads "$threads" --db "$db"
  fi
  if [ -n "${PREV_CLI:-}" ] && [ -d "$der" ]; then
    run "audit-prev-$k" "$PREV_CLI" audit "$der" --source "$src" --threads "$threads" --db "$db.prev"
  fi
done
echo "cold cache: $cache_note" >> "$log"

python3 - "$record" "$log" "$cache_note" "${trees[@]}" > "$results/summary.txt" <<'EOF'
import json, os, sys
record, log, note, trees = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
rows = [json.loads(l) for l in open(record) if l.strip()]
by = {r["label"]: r for r in rows}
size = lambda d: sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(d) for f in fs)
sizes = [size(t) for t in trees]
total = sum(sizes)
print("trees: " + ", ".join(f"{t} {s / 1e9:.2f} GB" for t, s in zip(trees, sizes)))
print(f"cold cache: {note}")
base = {"cp": by.get("cp"), "hash": by.get("hash"), "cat": by.get("cat")}
print(f"{'command':<20}{'rc':>4}{'wall s':>9}{'GB/s':>7}{'RSS MiB':>9}{'read GB':>9}"
      f"{'write GB':>9}{'/cat':>7}{'/hash':>7}{'/cp':>7}")
for r in rows:
    tree_bytes = sizes[0] if r["label"] in ("cp", "gen-src", "audit-src", "fingerprint-src",
                                             "transcode", "inspect") else total
    if r["label"] in ("gen-derived", "fingerprint-derived"): tree_bytes = sizes[-1]
    ratio = lambda b: f"{r['wall_s'] / b['wall_s']:.2f}" if b and b["wall_s"] > 0 else "-"
    print(f"{r['label']:<20}{r['rc']:>4}{r['wall_s']:>9.2f}{tree_bytes / r['wall_s'] / 1e9:>7.2f}"
          f"{r['peak_rss_mib']:>9.0f}{r['read_bytes'] / 1e9:>9.2f}{r['write_bytes'] / 1e9:>9.2f}"
          f"{ratio(base['cat']):>7}{ratio(base['hash']):>7}{ratio(base['cp']):>7}")
# The message of every command that failed (e.g. RESOURCE_EXHAUSTED refusals).
text = open(log).read().split("\n== ")
for r in rows:
    if r["rc"] != 0:
        for block in text:
            if block.startswith(r["label"] + ":"):
                msg = [l for l in block.splitlines()[1:] if l and not l.startswith("{")]
                print(f"{r['label']} exited {r['rc']}: " + " | ".join(msg[-3:])[:600])
EOF
cat "$results/summary.txt"
[ $keep = 1 ] || rm -rf "$src" "$der"
