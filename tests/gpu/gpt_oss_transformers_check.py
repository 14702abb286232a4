#!/usr/bin/env python3
"""Checks ckpt-audit's gpt-oss decoding against transformers' own MXFP4 dequantization.

For every `*_blocks`/`*_scales` pair of the gpt-oss MXFP4 fixture, transformers'
`convert_moe_packed_tensors` (transformers.integrations.mxfp4) gives the values as the model
loads them, [E, in, out]; ckpt-audit's values come from `gpt-oss-fixture dump` (one F32
[E, fused rows, in] tensor per stacked expert tensor, tests/quant/gpt_oss_fixture.h). They
must agree bit for bit (float32, signed zeros included) on every element.

With --modelopt, the ModelOpt NVFP4 export is also decoded here, independently of ckpt-audit,
from the layout ModelOpt's exporter writes (docs/quant.md "gpt-oss layouts": packed [E, in/2,
rows] and block scales [E, in/16, rows], transposed back; e2m1 x float8_e4m3fn scale x
weight_scale_2) and compared with transformers' MXFP4 values: --expect lossless requires every
element equal, --expect lossy requires at least one difference. ckpt-audit's dump of the export
(--modelopt-decoded) must equal this decoding bit for bit.

Exit 0 when every check passes, 1 on any difference, 2 on bad input; without torch,
safetensors or transformers it prints why and exits 0 having checked nothing ("SKIPPED").

Here (CPU only, deterministic), write ckpt-audit's dumps into a folder that travels with the
working tree (untracked, not ignored):
  mkdir -p gptoss-check
  for d in mini-gpt-oss-mxfp4 mini-gpt-oss-modelopt-nvfp4 mini-gpt-oss-modelopt-lossy; do
    build/tests/quant/gpt-oss-fixture dump tests/data/$d gptoss-check/$d.safetensors; done
then on the device host, from the repository root:
  python3 tests/gpu/gpt_oss_transformers_check.py --dumps gptoss-check
(or one pair at a time with --fixture/--decoded/--modelopt/--modelopt-decoded/--expect).
"""

import argparse
import json
import os
import sys


def load(path):
    from safetensors.torch import load_file

    return load_file(path)


def bits(t):
    import torch

    return t.contiguous().to(torch.float32).view(torch.int32)


def compare(label, want, got):
    """Prints the count of differing elements (bitwise, float32); returns it."""
    if tuple(want.shape) != tuple(got.shape):
        print(f"  {label}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
        return max(want.numel(), 1)
    diff = bits(want) != bits(got)
    n = int(diff.sum())
    print(f"  {label}: {want.numel()} elements, {n} differ")
    if n:
        idx = diff.nonzero()[0].tolist()
        print(f"    first at {idx}: expected {want[tuple(idx)].item()!r}, "
              f"got {got[tuple(idx)].item()!r}")
    return n


def modelopt_values(tensors, base):
    """Element values [E, rows, in] of a ModelOpt gpt-oss NVFP4 tensor, decoded with torch."""
    import torch

    lut = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=torch.float64)
    packed = tensors[base].transpose(1, 2).contiguous()  # [E, rows, in/2]
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2).long()  # low = even
    scale = tensors[base + "_weight_scale"].view(torch.float8_e4m3fn).to(torch.float32).double()
    scale = scale.transpose(1, 2).repeat_interleave(16, dim=-1)  # [E, rows, in]
    s2 = tensors[base + "_weight_scale_2"].to(torch.float64).reshape(())
    return (lut[codes] * scale * s2).to(torch.float32)


def load_dir(path):
    out = {}
    for f in sorted(f for f in os.listdir(path) if f.endswith(".safetensors")):
        out.update(load(os.path.join(path, f)))
    return out


def check(fixture, decoded, modelopt=None, modelopt_decoded=None, expect="lossless"):
    """Runs the checks of one (fixture, export) pair; returns the number that failed."""
    import torch
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    src = load_dir(fixture)
    ours = load(decoded)
    bases = sorted(n[: -len("_blocks")] for n in src if n.endswith("_blocks"))
    if not bases:
        print(f"{fixture}: no *_blocks tensors")
        return 1
    with open(os.path.join(fixture, "config.json")) as fh:
        quant = json.load(fh).get("quantization_config", {})
    print(f"{fixture}: quant_method {quant.get('quant_method')!r}, {len(bases)} expert tensors")
    failures = 0
    reference = {}
    for base in bases:
        # transformers gives [E, in, rows]; ckpt-audit's dump is [E, rows, in].
        tf = convert_moe_packed_tensors(src[base + "_blocks"], src[base + "_scales"],
                                        dtype=torch.float32).cpu()
        reference[base] = tf.transpose(1, 2).contiguous()
        failures += compare(f"{base} transformers vs ckpt-audit", reference[base],
                            ours.get(base, torch.empty(0))) > 0
        # transformers' default (BF16), as the model loads it; every fixture value fits BF16.
        tf16 = convert_moe_packed_tensors(src[base + "_blocks"], src[base + "_scales"]).cpu()
        failures += compare(f"{base} transformers bf16 vs ckpt-audit",
                            tf16.transpose(1, 2).to(torch.float32),
                            ours.get(base, torch.empty(0))) > 0
    if modelopt:
        mo = load_dir(modelopt)
        mo_ours = load(modelopt_decoded) if modelopt_decoded else {}
        total_diff = 0
        print(f"{modelopt}: expected {expect}")
        for base in bases:
            if base + "_weight_scale" not in mo:
                print(f"  {base}: missing from {modelopt}")
                failures += 1
                continue
            vals = modelopt_values(mo, base)
            total_diff += compare(f"{base} ModelOpt export vs transformers MXFP4",
                                  reference[base], vals)
            if modelopt_decoded:
                failures += compare(f"{base} ModelOpt export: torch vs ckpt-audit", vals,
                                    mo_ours.get(base, torch.empty(0))) > 0
        if expect == "lossless" and total_diff:
            failures += 1
        if expect == "lossy" and not total_diff:
            print("  expected the export to be lossy, but every value matches")
            failures += 1
    return failures


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dumps", help="directory of the three dumps: runs every check below")
    p.add_argument("--data", default="tests/data", help="fixture directory (with --dumps)")
    p.add_argument("--fixture", help="gpt-oss MXFP4 checkpoint directory")
    p.add_argument("--decoded", help="gpt-oss-fixture dump of --fixture")
    p.add_argument("--modelopt", help="ModelOpt NVFP4 export of --fixture")
    p.add_argument("--modelopt-decoded", help="gpt-oss-fixture dump of --modelopt")
    p.add_argument("--expect", choices=["lossless", "lossy"], default="lossless")
    a = p.parse_args()
    if not a.dumps and not (a.fixture and a.decoded):
        p.error("give --dumps, or --fixture and --decoded")
    try:
        import torch
        import safetensors.torch  # noqa: F401
        import transformers
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors  # noqa: F401
    except ImportError as e:
        print(f"SKIPPED: {e} (needs torch, safetensors and transformers: run on the device host)")
        return 0
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"cuda {torch.cuda.is_available()}")
    if a.dumps:
        src = "mini-gpt-oss-mxfp4"
        runs = [(os.path.join(a.data, src), os.path.join(a.dumps, src + ".safetensors"),
                 os.path.join(a.data, mo), os.path.join(a.dumps, mo + ".safetensors"), expect)
                for mo, expect in [("mini-gpt-oss-modelopt-nvfp4", "lossless"),
                                   ("mini-gpt-oss-modelopt-lossy", "lossy")]]
    else:
        runs = [(a.fixture, a.decoded, a.modelopt, a.modelopt_decoded, a.expect)]
    failures = sum(check(*r) for r in runs)
    print("OK" if failures == 0 else f"FAILED: {failures} check(s) differ")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
