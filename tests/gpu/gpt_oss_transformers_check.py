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

On the device host, from the repository root (the fixtures are in tests/data):
  .device-rig/bin/gpt-oss-fixture dump tests/data/mini-gpt-oss-mxfp4 $OUT/src.safetensors
  .device-rig/bin/gpt-oss-fixture dump tests/data/mini-gpt-oss-modelopt-nvfp4 $OUT/mo.safetensors
  .device-rig/bin/gpt-oss-fixture dump tests/data/mini-gpt-oss-modelopt-lossy $OUT/lossy.safetensors
  python3 tests/gpu/gpt_oss_transformers_check.py --fixture tests/data/mini-gpt-oss-mxfp4 \\
      --decoded $OUT/src.safetensors \\
      --modelopt tests/data/mini-gpt-oss-modelopt-nvfp4 --modelopt-decoded $OUT/mo.safetensors
  python3 tests/gpu/gpt_oss_transformers_check.py --fixture tests/data/mini-gpt-oss-mxfp4 \\
      --decoded $OUT/src.safetensors --modelopt tests/data/mini-gpt-oss-modelopt-lossy \\
      --modelopt-decoded $OUT/lossy.safetensors --expect lossy
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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--fixture", required=True, help="gpt-oss MXFP4 checkpoint directory")
    p.add_argument("--decoded", required=True, help="gpt-oss-fixture dump of --fixture")
    p.add_argument("--modelopt", help="ModelOpt NVFP4 export of --fixture")
    p.add_argument("--modelopt-decoded", help="gpt-oss-fixture dump of --modelopt")
    p.add_argument("--expect", choices=["lossless", "lossy"], default="lossless")
    a = p.parse_args()
    try:
        import torch
        import safetensors.torch  # noqa: F401
        from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    except ImportError as e:
        print(f"SKIPPED: {e} (needs torch, safetensors and transformers: run on the device host)")
        return 0
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"cuda {torch.cuda.is_available()}")
    shards = sorted(f for f in os.listdir(a.fixture) if f.endswith(".safetensors"))
    src = {}
    for f in shards:
        src.update(load(os.path.join(a.fixture, f)))
    ours = load(a.decoded)
    bases = sorted(n[: -len("_blocks")] for n in src if n.endswith("_blocks"))
    if not bases:
        print(f"{a.fixture}: no *_blocks tensors")
        return 2
    with open(os.path.join(a.fixture, "config.json")) as fh:
        quant = json.load(fh).get("quantization_config", {})
    print(f"{a.fixture}: quant_method {quant.get('quant_method')!r}, {len(bases)} expert tensors")
    failures = 0
    reference = {}
    for base in bases:
        if base not in ours:
            print(f"  {base}: missing from {a.decoded}")
            failures += 1
            continue
        # transformers gives [E, in, rows]; ckpt-audit's dump is [E, rows, in].
        tf = convert_moe_packed_tensors(src[base + "_blocks"], src[base + "_scales"],
                                        dtype=torch.float32).cpu()
        reference[base] = tf.transpose(1, 2).contiguous()
        failures += compare(f"{base} transformers vs ckpt-audit", reference[base], ours[base]) > 0
        # transformers' default (BF16) as the model loads it, where every value fits BF16.
        tf16 = convert_moe_packed_tensors(src[base + "_blocks"], src[base + "_scales"]).cpu()
        failures += compare(f"{base} transformers bf16 vs ckpt-audit",
                            tf16.transpose(1, 2).to(torch.float32), ours[base]) > 0
    if a.modelopt:
        mo = {}
        for f in sorted(f for f in os.listdir(a.modelopt) if f.endswith(".safetensors")):
            mo.update(load(os.path.join(a.modelopt, f)))
        mo_ours = load(a.modelopt_decoded) if a.modelopt_decoded else {}
        total_diff = 0
        for base in bases:
            if base not in mo:
                print(f"  {base}: missing from {a.modelopt}")
                failures += 1
                continue
            vals = modelopt_values(mo, base)
            n = compare(f"{base} ModelOpt export vs transformers MXFP4", reference[base], vals)
            total_diff += n
            if a.modelopt_decoded:
                failures += compare(f"{base} ModelOpt export: torch vs ckpt-audit", vals,
                                    mo_ours.get(base, torch.empty(0))) > 0
        if a.expect == "lossless" and total_diff:
            failures += 1
        if a.expect == "lossy" and not total_diff:
            print("  expected the export to be lossy, but every value matches")
            failures += 1
    print("OK" if failures == 0 else f"FAILED: {failures} check(s) differ")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
