"""Torch eager reference of the Kimi-K3-sized routed-expert stage, timed on the same GPU.

Replays the routing that moe_bench used (its JSON on --ours), with random MXFP4 weights of the
same shapes generated on the GPU: for each selected expert, dequantize w1/w3/w2 (E2M1 lookup,
E8M0 scale), SiTU-GLU, down-projection, weighted sum. Prints our time, torch's time and the
ratio for each run of moe_bench.

    python3 torch_reference.py --ours bench.json [--iters 5]
"""
import argparse
import json

import torch

LATENT, INTER, EXPERTS = 3584, 3072, 896
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def dequant(packed, scales, lut):
    """packed [R, C/2] uint8 (low nibble = even column), scales [R, C/32] E8M0 -> bf16 [R, C]."""
    rows = packed.shape[0]
    w = torch.stack([lut[(packed & 15).long()], lut[(packed >> 4).long()]], dim=-1).reshape(rows, -1)
    s = torch.exp2(scales.float() - 127.0).to(torch.bfloat16)
    return (w.view(rows, -1, 32) * s.unsqueeze(-1)).reshape(rows, -1)


def situ_glu(g, u, beta=4.0, linear_beta=25.0):
    return (beta * torch.tanh(g / beta) * torch.sigmoid(g)) * (linear_beta * torch.tanh(u / linear_beta))


def moe(z, ids, weights, wts, lut):
    tokens = z.shape[0]
    y = torch.zeros(tokens, LATENT, dtype=torch.float32, device=z.device)
    for e in torch.unique(ids).tolist():
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w1 = dequant(wts["p"][0][e], wts["s"][0][e], lut)
        w3 = dequant(wts["p"][1][e], wts["s"][1][e], lut)
        w2 = dequant(wts["p"][2][e], wts["s"][2][e], lut)
        zz = z[tok]
        a = situ_glu(zz @ w1.T, zz @ w3.T)
        h = (a @ w2.T).float()
        y.index_add_(0, tok, h * weights[tok, slot].unsqueeze(-1))
    return y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", required=True)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    ours = json.load(open(args.ours))
    dev = torch.device("cuda")
    torch.manual_seed(0)
    lut = torch.tensor(E2M1, dtype=torch.bfloat16, device=dev)
    wts = {
        "p": [torch.randint(0, 256, (EXPERTS, INTER, LATENT // 2), dtype=torch.uint8, device=dev),
              torch.randint(0, 256, (EXPERTS, INTER, LATENT // 2), dtype=torch.uint8, device=dev),
              torch.randint(0, 256, (EXPERTS, LATENT, INTER // 2), dtype=torch.uint8, device=dev)],
        "s": [torch.randint(118, 126, (EXPERTS, INTER, LATENT // 32), dtype=torch.uint8, device=dev),
              torch.randint(118, 126, (EXPERTS, INTER, LATENT // 32), dtype=torch.uint8, device=dev),
              torch.randint(118, 126, (EXPERTS, LATENT, INTER // 32), dtype=torch.uint8, device=dev)],
    }
    results = []
    for run in ours["runs"]:
        if run["format"] != "mxfp4":
            continue
        t = run["tokens"]
        ids = torch.tensor(run["routing_ids"], dtype=torch.long, device=dev).view(t, -1)
        weights = torch.tensor(run["routing_weights_x32"], dtype=torch.float32, device=dev).view(t, -1) / 32
        z = (torch.rand(t, LATENT, device=dev) * 2 - 1).to(torch.bfloat16)
        moe(z, ids, weights, wts, lut)  # warm-up
        torch.cuda.synchronize()
        times = []
        for _ in range(args.iters):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            moe(z, ids, weights, wts, lut)
            e1.record()
            torch.cuda.synchronize()
            times.append(e0.elapsed_time(e1))
        times.sort()
        torch_ms = times[len(times) // 2]
        ours_ms = float(run["ours_ms"])
        results.append({"tokens": t, "distinct_experts": run["distinct_experts"],
                        "torch_eager_ms": "%.3f" % torch_ms, "ours_ms": run["ours_ms"],
                        "speedup_vs_torch_eager": "%.1f" % (torch_ms / ours_ms),
                        "fraction_of_hbm_floor": run["fraction_of_hbm_floor"]})
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                      "comparison": results}, indent=2))


if __name__ == "__main__":
    main()
