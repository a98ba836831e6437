#!/usr/bin/python3
"""PyTorch's side of bench/autocast_fidelity.sh (issue 29's fidelity check).

Trains dtrain's GPT-2 (Hugging Face names and layouts: Conv1D weights are
[in, out], lm-head tied to wte) from dtrain's own initial checkpoint on the
same tokens, twice: in float32, and with torch.autocast("cpu",
dtype=torch.bfloat16) around the forward and the loss, as a PyTorch user
mixes precision on a CPU. Then it compares, for each framework, how far its
bf16 run strays from its own fp32 run, and checks that dtrain's fp32 run and
PyTorch's fp32 run are the same training (else the comparison means
nothing).

The batches are dtrain's: its token windows (with --val-path the whole file
trains; window i is x = tokens[i T, i T + T), y = the same shifted by one)
drawn in the order of its sampler (src/data/sampler.c: a Fisher-Yates
shuffle per epoch by src/tensor/rng.c's generator, seeded from the run's
seed and the epoch; an epoch's short tail is dropped), which this file
re-implements. The fp32 row at the end shows the two runs saw the same data.

Reads: --init (safetensors, dtrain's format), the corpus, dtrain's metrics
(JSON lines with "step" and "loss") and final checkpoints. Prints a table
and writes the figures as JSON (--out)."""
import argparse
import json
import math
import struct

import numpy as np
import torch
import torch.nn.functional as F


def read_safetensors(path):
    """{name: float32 tensor} of the model's tensors (optimizer state left out)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = {}
    for name, d in header.items():
        if name.startswith("optim."):
            continue
        if d["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {d['dtype']}, expected F32")
        lo, hi = d["data_offsets"]
        a = np.frombuffer(raw[base + lo:base + hi], dtype="<f4").reshape(d["shape"])
        out[name] = torch.from_numpy(a.copy())
    return meta, out


M64 = (1 << 64) - 1


class Rng:
    """src/tensor/rng.c: splitmix64 seeding, xoroshiro128** stream"""

    def __init__(self, seed):
        x = seed & M64
        s = []
        for _ in range(2):
            x = (x + 0x9e3779b97f4a7c15) & M64
            z = x
            z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
            z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
            s.append(z ^ (z >> 31))
        if s == [0, 0]:
            s[1] = 1
        self.s = s

    @staticmethod
    def rotl(x, k):
        return ((x << k) | (x >> (64 - k))) & M64

    def next64(self):
        s0, s1 = self.s
        out = (self.rotl((s0 * 5) & M64, 7) * 9) & M64
        s1 ^= s0
        self.s = [self.rotl(s0, 24) ^ s1 ^ ((s1 << 16) & M64), self.rotl(s1, 37)]
        return out

    def below(self, n):
        limit = M64 - M64 % n
        while True:
            x = self.next64()
            if x < limit:
                return x % n


def sampler_batches(n, B, steps, seed):
    """the window indices of each step's batch, as dtrain's sampler (one rank) draws them"""
    out, epoch = [], 0
    while len(out) < steps:
        perm = list(range(n))
        r = Rng(seed ^ ((epoch * 0x9e3779b97f4a7c15) & M64))
        for i in range(n - 1, 0, -1):
            j = r.below(i + 1)
            perm[i], perm[j] = perm[j], perm[i]
        out += [perm[k:k + B] for k in range(0, n - B + 1, B)]
        epoch += 1
    return out[:steps]


def batches_from_corpus(path, T, B, steps, seed):
    tok = np.frombuffer(open(path, "rb").read(), dtype=np.uint8).astype(np.int64)
    n = (len(tok) - 1) // T
    if n < B:
        raise SystemExit(f"{path}: {n} windows of {T}, fewer than a batch of {B}")
    out = []
    for idx in sampler_batches(n, B, steps, seed):
        x = np.stack([tok[i * T:i * T + T] for i in idx])
        y = np.stack([tok[i * T + 1:i * T + T + 1] for i in idx])
        out.append((torch.from_numpy(x), torch.from_numpy(y)))
    return out


def gpt2_loss(P, x, y, L, H):
    """Mean causal-LM cross-entropy of dtrain's GPT-2 (pre-LN, GELU-tanh)."""
    B, T = x.shape
    C = P["wte.weight"].shape[1]
    hd = C // H
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    h = P["wte.weight"][x] + P["wpe.weight"][:T]
    for layer in range(L):
        p = f"h.{layer}."
        a = F.layer_norm(h, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], 1e-5)
        qkv = torch.addmm(P[p + "attn.c_attn.bias"], a.reshape(B * T, C), P[p + "attn.c_attn.weight"])
        q, k, v = qkv.view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4)     # 3 x [B, H, T, hd]
        att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        o = torch.matmul(att, v).transpose(1, 2).reshape(B * T, C)
        h = h + torch.addmm(P[p + "attn.c_proj.bias"], o, P[p + "attn.c_proj.weight"]).view(B, T, C)
        m = F.layer_norm(h, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], 1e-5)
        f = F.gelu(torch.addmm(P[p + "mlp.c_fc.bias"], m.reshape(B * T, C), P[p + "mlp.c_fc.weight"]),
                   approximate="tanh")
        h = h + torch.addmm(P[p + "mlp.c_proj.bias"], f, P[p + "mlp.c_proj.weight"]).view(B, T, C)
    h = F.layer_norm(h, (C,), P["ln_f.weight"], P["ln_f.bias"], 1e-5)
    logits = torch.matmul(h.reshape(B * T, C), P["wte.weight"].t())
    return F.cross_entropy(logits.float(), y.reshape(-1))   # the loss in fp32, as autocast's policy lists it


def train(init, batches, L, H, lr, bf16):
    P = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    opt = torch.optim.AdamW(P.values(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    losses = []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = gpt2_loss(P, x, y, L, H)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach() for k, v in P.items()}


def one_step_grads(init, batch, L, H, bf16):
    """The gradient of the first batch's loss at the initial weights."""
    P = {k: v.clone().requires_grad_(True) for k, v in init.items()}
    x, y = batch
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = gpt2_loss(P, x, y, L, H)
    loss.backward()
    return {k: v.grad.detach().double() for k, v in P.items()}


def dtrain_grads(init, path, lr):
    """dtrain's gradient from one SGD step (no momentum, no decay) at learning
    rate lr: (w0 - w1) / lr. w1 is float32, so each element carries an error
    of up to half an ulp of |w0| + lr |g|; a large lr (1000) makes that small
    against lr |g| wherever the gradient matters to the norm (the fp32 row,
    dtrain against PyTorch, shows the floor: 2.5e-7 on W1)."""
    w1 = read_safetensors(path)[1]
    return {k: (init[k].double() - w1[k].double()) / lr for k in init}


def metrics_losses(path, steps):
    got = {}
    for line in open(path):
        d = json.loads(line)
        if "step" in d and "loss" in d:
            got[d["step"]] = d["loss"]
    missing = [s for s in range(1, steps + 1) if s not in got]
    if missing:
        raise SystemExit(f"{path}: no loss for steps {missing[:5]}")
    return [got[s] for s in range(1, steps + 1)]


def rel_loss_gap(a, b):
    """max over steps of |a - b| / |a|, and the same at the last step"""
    gaps = [abs(u - v) / abs(u) for u, v in zip(a, b)]
    return max(gaps), gaps[-1]


def rel_param_gap(p, q):
    """||p - q|| / ||p|| over every parameter"""
    num = sum(float(((p[k].double() - q[k].double()) ** 2).sum()) for k in p)
    den = sum(float((p[k].double() ** 2).sum()) for k in p)
    return math.sqrt(num / den)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--init", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--seed", type=int, default=1, help="dtrain's --seed (its sampler's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtrain", nargs=2, action="append", metavar=("LABEL", "RUN"), default=[],
                    help="a dtrain run: RUN.jsonl (metrics) and RUN.st (final checkpoint); the first is fp32")
    ap.add_argument("--dtrain-grad", nargs=2, action="append", metavar=("LABEL", "CKPT"), default=[],
                    help="a dtrain checkpoint after one SGD step at --grad-lr from --init on the first batch "
                         "(its gradient is (init - ckpt) / lr); the first is fp32")
    ap.add_argument("--grad-lr", type=float, default=1000.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    meta, init = read_safetensors(a.init)
    L, H = int(meta["arch.layers"]), int(meta["arch.heads"])
    batches = batches_from_corpus(a.corpus, a.seq, a.batch, a.steps, a.seed)

    t32, p32 = train(init, batches, L, H, a.lr, bf16=False)
    t16, p16 = train(init, batches, L, H, a.lr, bf16=True)
    rows = [("PyTorch autocast bf16", rel_loss_gap(t32, t16), rel_param_gap(p32, p16))]
    runs = [(label, metrics_losses(run + ".jsonl", a.steps), read_safetensors(run + ".st")[1])
            for label, run in a.dtrain]
    (_, d32, q32), others = runs[0], runs[1:]
    for label, d, q in others:
        rows.append((f"dtrain {label}", rel_loss_gap(d32, d), rel_param_gap(q32, q)))
    same = rel_loss_gap(t32, d32), rel_param_gap(p32, q32)

    print(f"{'run':44} {'max loss gap':>13} {'last loss gap':>14} {'weights gap':>12}   (each against its own fp32 run)")
    for label, (mx, last), pg in rows:
        print(f"{label:44} {mx:13.3e} {last:14.3e} {pg:12.3e}")
    print(f"{'dtrain fp32 against PyTorch fp32':44} {same[0][0]:13.3e} {same[0][1]:14.3e} {same[1]:12.3e}")
    grads = {}
    if a.dtrain_grad:
        # the one-step gradient: it does not compound over steps as the loss
        # gaps do (a perturbation at one sensitive step grows for the rest)
        g32, g16 = one_step_grads(init, batches[0], L, H, False), one_step_grads(init, batches[0], L, H, True)
        dg = [(label, dtrain_grads(init, ck, a.grad_lr)) for label, ck in a.dtrain_grad]
        grads["PyTorch autocast bf16"] = rel_param_gap(g32, g16)
        for label, g in dg[1:]:
            grads[f"dtrain {label}"] = rel_param_gap(dg[0][1], g)
        grads["dtrain fp32 against PyTorch fp32"] = rel_param_gap(g32, dg[0][1])
        print(f"{'one-step gradient at the initial weights':44} {'gap':>12}   (||g - g_fp32|| / ||g_fp32||)")
        for label, gap in grads.items():
            print(f"{label:44} {gap:12.3e}")
    print("losses (step: PyTorch fp32, PyTorch bf16, " + ", ".join(f"dtrain {l}" for l, _ in a.dtrain) + ")")
    for s in range(a.steps):
        print(f"{s + 1:4}: {t32[s]:.6f} {t16[s]:.6f} " + " ".join(f"{r[1][s]:.6f}" for r in runs))
    json.dump({"torch_fp32": t32, "torch_bf16": t16,
               "dtrain": {label: d for label, d, _ in runs},
               "gaps": {label: {"max_loss": mx, "last_loss": last, "weights": pg} for label, (mx, last), pg in rows},
               "dtrain_fp32_vs_torch_fp32": {"max_loss": same[0][0], "last_loss": same[0][1], "weights": same[1]},
               "one_step_grad_gaps": grads,
               "torch": torch.__version__},
              open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
