#!/usr/bin/env bash
# An audit split in parts on one host (docs/PERFORMANCE.md, "Audit parts"; docs/audit-parts.md).
#
#   bash bench/scale/run_parts.sh --dir WORK [--bin DIR] [--results DIR] [--threads T]
#        [--parts "1 2 4 8"] [--keep] [-- GEN-ARGS...]
#
# GEN-ARGS go to `ckpt-scale-gen gen` (default: --geometry kimi-k3 --layers 1 --shard-size 2G).
# In WORK it generates the MXFP4 source and its NVFP4 transcode, then, each from a cold page
# cache:
#   hash          SHA-256 (OpenSSL) of every file of both trees, T threads (the baseline)
#   audit         `ckpt-audit audit DERIVED --source SRC` on T threads (one process)
#   parts-N       for each N: N concurrent `audit --part I/N` processes, T/N threads each (at
#                 least 1), timed from the first start to the last exit; their storage reads
#                 summed (each process's wait4 rusage)
#   merge-N       `audit --merge` of those N parts (it re-reads listings, small files and
#                 headers only)
# Each line of record.jsonl is one command (ckpt-scale-gen time); summary.txt gives wall time,
# speedup over parts-1, bytes read per tree byte, and whether every merge appended a passing
# record. The device has no Slurm (no Debian packages): the parts run as processes here, the
# way an sbatch array would run them on N nodes, but sharing one disk and 16 cores.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work="" bin="" results="" threads=$(nproc) keep=0 counts="1 2 4 8"
gen_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) work=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --parts) counts=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --) shift; gen_args=("$@"); break ;;
    *) echo "run_parts.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$work" ] || { echo "run_parts.sh: --dir WORK is required" >&2; exit 2; }
[ ${#gen_args[@]} -gt 0 ] || gen_args=(--geometry kimi-k3 --layers 1 --shard-size 2G)
if [ -z "$bin" ]; then bin=$(cd "$here/../.." && pwd)/build; fi
gen=$(ls "$bin/ckpt-scale-gen" "$bin/bench/scale/ckpt-scale-gen" 2>/dev/null | head -1)
cli=$(ls "$bin/ckpt-audit" "$bin/services/cli/ckpt-audit" 2>/dev/null | head -1)
[ -x "$gen" ] && [ -x "$cli" ] || { echo "run_parts.sh: no ckpt-scale-gen/ckpt-audit in $bin" >&2; exit 2; }
results=${results:-$work.parts-results}
mkdir -p "$work" "$results"
work=$(cd "$work" && pwd)
src=$work/src der=$work/derived keys=$work/keys
record=$results/record.jsonl log=$results/run.log
: > "$record"
: > "$log"
export XDG_DATA_HOME=$work/xdg
{
  echo "== machine"; date -u; uname -r; nproc; free -g | head -2; df -h "$work" | tail -1
  grep -m1 'model name' /proc/cpuinfo
  echo "threads $threads; parts: $counts; gen args: ${gen_args[*]}"
} >> "$log" 2>&1

drop() {
  sync
  echo 3 > /proc/sys/vm/drop_caches 2>/dev/null ||
    find "$src" "$der" -type f -exec dd if={} iflag=nocache count=0 status=none \;
}
timed() {  # timed LABEL CMD...: one command, its rusage into record.jsonl, output into run.log
  local label=$1; shift
  echo "== $label: $*" >> "$log"
  "$gen" time --label "$label" --record "$record" -- "$@" >> "$log" 2>&1
}

rm -rf "$src" "$der" "$keys" "$work/xdg" "$work"/parts-* "$work"/*.db*
"$gen" gen "${gen_args[@]}" --format mxfp4 --threads "$threads" --out "$src" >> "$log" 2>&1 &&
  "$gen" gen "${gen_args[@]}" --format nvfp4 --threads "$threads" --out "$der" >> "$log" 2>&1 ||
  { echo "run_parts.sh: generation failed (see $log)" >&2; exit 1; }
mkdir -p "$keys"
"$cli" keys generate --out "$keys/record.pem" >> "$log" 2>&1
"$cli" keys generate --out "$keys/node.pem" --trust "$keys/nodes.trust" --name node >> "$log" 2>&1

drop; timed hash "$gen" hash --threads "$threads" "$src" "$der"
drop; timed audit "$cli" audit "$der" --source "$src" --threads "$threads" --db "$work/single.db" \
  --key "$keys/record.pem"
for n in $counts; do
  dir=$work/parts-$n
  mkdir -p "$dir"
  per=$(( threads / n )); [ "$per" -ge 1 ] || per=1
  drop
  start=$(date +%s.%N)
  for ((i = 0; i < n; i++)); do
    timed "part-$i-of-$n" "$cli" audit "$der" --source "$src" --threads "$per" \
      --part "$i/$n" --part-key "$keys/node.pem" --out "$dir/part-$i.json" &
  done
  wait
  end=$(date +%s.%N)
  awk -v n="$n" -v s="$start" -v e="$end" 'BEGIN { printf "{\"label\":\"parts-%s\",\"wall_s\":%.3f}\n", n, e - s }' >> "$record"
  timed "merge-$n" "$cli" audit --merge "$dir"/part-*.json --db "$work/parts-$n.db" \
    --key "$keys/record.pem" --part-trust "$keys/nodes.trust"
done

python3 - "$record" "$log" "$src" "$der" "$counts" > "$results/summary.txt" <<'EOF'
import json, os, re, sys
record, log, src, der, counts = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
rows = [json.loads(l) for l in open(record) if l.strip()]
by = {r["label"]: r for r in rows}
size = lambda d: sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(d) for f in fs)
shards = lambda d: sum(1 for f in os.listdir(d) if f.endswith(".safetensors"))
total = size(src) + size(der)
print(f"trees: {src} {size(src) / 1e9:.2f} GB in {shards(src)} shards, "
      f"{der} {size(der) / 1e9:.2f} GB in {shards(der)} shards")
text = open(log).read()
def verdict(label):
    block = text.split(f"== {label}:")[-1].split("\n== ")[0]
    m = re.search(r"verdict (\w+)", block)
    return m.group(1) if m else "?"
print(f"{'run':<10}{'wall s':>9}{'speedup':>9}{'GB/s':>7}{'read/trees':>12}{'max RSS MiB':>13}"
      f"{'merge s':>9}{'merged':>8}")
for label in ("hash", "audit"):
    r = by[label]
    print(f"{label:<10}{r['wall_s']:>9.2f}{'':>9}{total / r['wall_s'] / 1e9:>7.2f}"
          f"{r['read_bytes'] / total:>12.3f}{r['peak_rss_mib']:>13.0f}")
one = by.get("parts-1", {}).get("wall_s")
for n in counts.split():
    parts = [r for r in rows if r["label"].endswith(f"-of-{n}")]
    wall = by[f"parts-{n}"]["wall_s"]
    read = sum(r["read_bytes"] for r in parts)
    rss = max(r["peak_rss_mib"] for r in parts)
    failed = [r["label"] for r in parts if r["rc"] != 0]
    merge = by.get(f"merge-{n}", {})
    speed = f"{one / wall:.2f}" if one else "-"
    print(f"{'parts-' + n:<10}{wall:>9.2f}{speed:>9}{total / wall / 1e9:>7.2f}{read / total:>12.3f}"
          f"{rss:>13.0f}{merge.get('wall_s', 0):>9.2f}{verdict('merge-' + n):>8}"
          + (f"  failed: {' '.join(failed)}" if failed else ""))
EOF
cat "$results/summary.txt"
[ $keep = 1 ] || rm -rf "$src" "$der"
