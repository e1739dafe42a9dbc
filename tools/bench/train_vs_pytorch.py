#!/usr/bin/env python3
"""`distopt train` vs a plain PyTorch loop, in the same run.

Both train the same model (train.model resnet: ResNet-18 layout with
GroupNorm, base width --width) on the same data (dataset: synthetic, generated
on the device from the sample indices by the same counter-based hash, so the
images, labels and the per-epoch order are identical), with the same batch,
steps, optimizer (SGD, momentum 0.9) and device, at world size 1. Each side
counts samples/s as `distopt train` does: samples over the seconds inside the
epoch's training loop (batch generation, forward, backward, step, the loss
read back every step), evaluation excluded; then test accuracy on the same
test split.

    tools/bench/train_vs_pytorch.py --device cpu --distopt build/bin/distopt \
        --plugins build/plugins --width 4 --steps 20 --batch 32 --size 12
    tools/bench/train_vs_pytorch.py --device cuda --communicator nccl ...

Steady state: each side runs --epochs epochs (default 2) of --steps steps
and the figure compared is the last epoch's samples/s. The first epoch also
pays for one-time work (CUDA context and library handles, cuDNN/cuBLAS
algorithm choice, lazy kernel loading, the caching allocator's first
blocks), which varies from process to process; it is printed beside. With
--repeat R the pair runs R times, the order alternating (distopt first, then
pytorch first, ...), and the medians are compared.

Prints a table and, last, two lines `distopt SAMPLES/S ACCURACY ...` and
`pytorch SAMPLES/S ACCURACY ...` (tools/gpu/smoke.sh reads the first two
fields). Needs python3-torch (1.13 from Debian here, 2.x with CUDA on the GPU
machine).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MASK = (1 << 64) - 1


def s64(v):
    """The int64 with the bits of the unsigned 64-bit v."""
    v &= MASK
    return v - (1 << 64) if v >> 63 else v


# ---- synthetic data: tools/distopt/train/synthetic.cpp, op for op ----------
def shr(x, s):
    return (x >> s) & ((1 << (64 - s)) - 1)


def splitmix64(x):
    z = x + s64(0x9E3779B97F4A7C15)
    z = (z ^ shr(z, 30)) * s64(0xBF58476D1CE4E5B9)
    z = (z ^ shr(z, 27)) * s64(0x94D049BB133111EB)
    return z ^ shr(z, 31)


def splitmix64_u(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def unit(h):
    return shr(h, 40).float() * (1.0 / 16777216.0)


class Synthetic:
    def __init__(self, seed, channels, height, width, classes, noise):
        self.seed, self.C, self.H, self.W = seed, channels, height, width
        self.classes, self.noise = classes, noise
        fr, fc, amp = [], [], []
        for k in range(classes):
            t = math.pi * k / classes
            f = 2.0 + (k % 2)
            fr.append(f * math.cos(t))
            fc.append(f * math.sin(t))
            for c in range(channels):
                n = k * channels + c
                u = lambda ctr: (splitmix64_u((seed * 0x2545F4914F6CDD1D + ctr) & MASK) >> 11) * (
                    1.0 / 9007199254740992.0)
                a = 0.5 + u(2 * n)
                amp.append(-a if u(2 * n + 1) < 0.5 else a)
        self.fr = torch.tensor(fr, dtype=torch.float32)
        self.fc = torch.tensor(fc, dtype=torch.float32)
        self.amp = torch.tensor(amp, dtype=torch.float32).view(classes, channels)

    def key(self, index, test):
        return index.long() + ((1 << 40) if test else 0) + s64(self.seed * 0xD1B54A32D192ED03)

    def batch(self, index, test):
        dev = index.device
        B, C, H, W = index.numel(), self.C, self.H, self.W
        key = self.key(index, test)
        y = shr(splitmix64(key), 1).remainder(self.classes)
        phase = unit(splitmix64(splitmix64(key) + 1)) * (2 * math.pi)
        if self.fr.device != dev:  # once, as synthetic.cpp caches them per device
            self.fr, self.fc, self.amp = self.fr.to(dev), self.fc.to(dev), self.amp.to(dev)
        fr, fc, amp = self.fr, self.fc, self.amp
        r = (torch.arange(H, dtype=torch.float32, device=dev) / float(H)).view(1, H, 1)
        q = (torch.arange(W, dtype=torch.float32, device=dev) / float(W)).view(1, 1, W)
        arg = fr.index_select(0, y).view(B, 1, 1) * r + fc.index_select(0, y).view(B, 1, 1) * q
        wave = torch.cos(arg.mul_(2 * math.pi).add_(phase.view(B, 1, 1)))
        x = amp.index_select(0, y).view(B, C, 1, 1) * wave.unsqueeze(1)
        if self.noise > 0:
            elem = torch.arange(C * H * W, dtype=torch.long, device=dev)
            h = splitmix64((splitmix64(key) + 2).view(B, 1) * s64(0x100000001B3) + elem)
            x.add_((unit(h) - 0.5).mul_(math.sqrt(12.0) * self.noise).view(B, C, H, W))
        return x, y


# ---- the epoch permutation of trainer.cpp: Fisher-Yates on mt19937_64 -------
class MT19937_64:
    def __init__(self, seed):
        self.mt = [0] * 312
        self.mt[0] = seed & MASK
        for i in range(1, 312):
            p = self.mt[i - 1]
            self.mt[i] = (6364136223846793005 * (p ^ (p >> 62)) + i) & MASK
        self.i = 312

    def __call__(self):
        if self.i >= 312:
            mt = self.mt
            for i in range(312):
                x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
                xa = x >> 1
                if x & 1:
                    xa ^= 0xB5026F5AA96619E9
                mt[i] = mt[(i + 156) % 312] ^ xa
            self.i = 0
        y = self.mt[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & MASK


def epoch_permutation(n, seed, epoch):
    p = list(range(n))
    gen = MT19937_64((seed * 0x9E3779B97F4A7C15 + epoch + 1) & MASK)
    for i in range(n - 1, 0, -1):
        j = gen() % (i + 1)
        p[i], p[j] = p[j], p[i]
    return p


# ---- the model of tools/distopt/train/models.cpp (same creation order) ------
def conv(i, o, k, stride):
    return nn.Conv2d(i, o, k, stride=stride, padding=k // 2, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, i, o, stride, groups):
        super().__init__()
        self.conv1, self.gn1 = conv(i, o, 3, stride), nn.GroupNorm(groups, o)
        self.conv2, self.gn2 = conv(o, o, 3, 1), nn.GroupNorm(groups, o)
        self.down = self.down_gn = None
        if stride != 1 or i != o:
            self.down, self.down_gn = conv(i, o, 1, stride), nn.GroupNorm(groups, o)

    def forward(self, x):
        h = F.relu(self.gn1(self.conv1(x)))
        h = self.gn2(self.conv2(h))
        return F.relu(h + (self.down_gn(self.down(x)) if self.down is not None else x))


class ResNet(nn.Module):
    def __init__(self, channels, classes, width):
        super().__init__()
        groups = math.gcd(8, width)
        self.stem, self.stem_gn = conv(channels, width, 3, 1), nn.GroupNorm(groups, width)
        blocks, i = [], width
        for stage in range(4):
            o = width << stage
            for b in range(2):
                blocks.append(BasicBlock(i, o, 2 if stage > 0 and b == 0 else 1, groups))
                i = o
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(i, classes)

    def forward(self, x):
        h = F.relu(self.stem_gn(self.stem(x)))
        for b in self.blocks:
            h = b(h)
        return self.fc(h.mean((2, 3)))


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def pytorch_run(a, dev):
    """The loop of trainer.cpp in plain PyTorch: ([samples/s per epoch], test accuracy)."""
    torch.manual_seed(a.seed)
    model = ResNet(3, a.classes, a.width).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    data = Synthetic(a.seed, 3, a.size, a.size, a.classes, a.noise)
    n = a.steps * a.batch
    sps = []
    for epoch in range(1, a.epochs + 1):
        perm = torch.tensor(epoch_permutation(n, a.seed, epoch), dtype=torch.long)
        model.train()
        sync(dev)
        t0 = time.perf_counter()
        for step in range(a.steps):
            x, y = data.batch(perm[step * a.batch:(step + 1) * a.batch].to(dev), False)
            opt.zero_grad()
            loss = F.nll_loss(F.log_softmax(model(x).float(), 1), y)
            loss.backward()
            opt.step()
            loss.item()  # as the trainer: the loss is read back every step
        sync(dev)
        sps.append(n / (time.perf_counter() - t0))
    model.eval()
    correct = 0
    with torch.no_grad():
        for lo in range(0, a.test, 1000):
            idx = torch.arange(lo, min(a.test, lo + 1000), device=dev)
            x, y = data.batch(idx, True)
            correct += (model(x).argmax(1) == y).sum().item()
    return sps, correct / a.test


def distopt_run(a, tmp):
    job = os.path.join(tmp, "job.yaml")
    metrics = os.path.join(tmp, "metrics.jsonl")
    with open(job, "w") as f:
        f.write(f"""plugins: {{paths: [{a.plugins}]}}
world: {{size: 1, timeout_s: 60}}
communicator: {{name: {a.communicator}}}
reducer: {{name: mean}}
algorithm: {{name: allreduce}}
optimizer: {{name: sgd, lr: {a.lr}, momentum: 0.9}}
train:
  model: resnet
  model_width: {a.width}
  dataset: synthetic
  synthetic: {{train_samples: {a.steps * a.batch}, test_samples: {a.test}, channels: 3,
              height: {a.size}, width: {a.size}, classes: {a.classes}, noise: {a.noise}}}
  device: {a.device}
  epochs: {a.epochs}
  batch_size: {a.batch}
  seed: {a.seed}
  threads: {a.threads}
  log_every: 0
""")
    r = subprocess.run([a.distopt, "train", job, "--metrics", metrics], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        sys.stdout.write(r.stdout if r.stdout.endswith("\n") else r.stdout + "\n")
        raise SystemExit(f"distopt train failed (exit {r.returncode})")
    events = [json.loads(l) for l in open(metrics) if l.strip()]
    sps = [e["samples_per_s"] for e in events if e.get("event") == "epoch"]
    summary = [e for e in events if e.get("event") == "summary"][-1]
    if len(sps) != a.epochs:
        raise SystemExit(f"distopt train wrote {len(sps)} epoch event(s), expected {a.epochs}")
    return sps, summary["final_test_accuracy"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda (the first GPU)")
    p.add_argument("--distopt", default="build/bin/distopt")
    p.add_argument("--plugins", default="build/plugins")
    p.add_argument("--communicator", default=None, help="default: tcp on cpu, nccl on cuda")
    p.add_argument("--width", type=int, default=None, help="resnet width (default 8 cpu, 64 cuda)")
    p.add_argument("--steps", type=int, default=50, help="steps per epoch")
    p.add_argument("--epochs", type=int, default=2,
                   help="epochs per run; the last one's samples/s is compared (default 2)")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of the pair, order alternating; medians compared (default 1)")
    p.add_argument("--batch", type=int, default=None, help="default 32 cpu, 256 cuda")
    p.add_argument("--size", type=int, default=None, help="image side (default 16 cpu, 32 cuda)")
    p.add_argument("--test", type=int, default=2000, help="test samples")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--noise", type=float, default=0.5)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads of both sides (0: all cores, as distopt train's default)")
    a = p.parse_args()
    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("train_vs_pytorch: --device cuda but torch.cuda.is_available() is false")
    if a.device not in ("cpu", "cuda"):
        raise SystemExit("train_vs_pytorch: --device must be cpu or cuda")
    # The job file lives in a temporary folder and distopt reads its paths
    # relative to it: pass absolute ones.
    a.plugins = os.path.abspath(a.plugins)
    if os.sep in a.distopt:
        a.distopt = os.path.abspath(a.distopt)
    a.communicator = a.communicator or ("nccl" if cuda else "tcp")
    a.width = a.width or (64 if cuda else 8)
    a.batch = a.batch or (256 if cuda else 32)
    a.size = a.size or (32 if cuda else 16)
    threads = a.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    if a.epochs < 1 or a.repeat < 1 or a.steps < 1:
        raise SystemExit("train_vs_pytorch: --epochs, --repeat and --steps must be >= 1")
    dev = torch.device("cuda:0" if cuda else "cpu")
    runs = {"distopt": [], "pytorch": []}  # (samples/s per epoch, accuracy) per run
    with tempfile.TemporaryDirectory(prefix="distopt-vs-pytorch-") as tmp:
        for r in range(a.repeat):
            order = ["distopt", "pytorch"] if r % 2 == 0 else ["pytorch", "distopt"]
            for side in order:
                if side == "distopt":
                    run_dir = os.path.join(tmp, f"run{r}")
                    os.makedirs(run_dir)
                    runs[side].append(distopt_run(a, run_dir))
                else:
                    runs[side].append(pytorch_run(a, dev))
    print(f"train vs pytorch: resnet width {a.width} on synthetic 3x{a.size}x{a.size}, "
          f"{a.epochs} epoch(s) of {a.steps} steps of {a.batch} on {a.device} ({threads} CPU "
          f"threads), torch {torch.__version__}, SGD lr {a.lr} momentum 0.9, {a.repeat} run(s) "
          "in alternating order; samples/s of the last epoch (median over runs), the first "
          "epoch's beside")
    print(f"{'':8} {'samples/s':>10} {'accuracy':>9} {'epoch 1':>10}  runs (last epoch)")
    med = {}
    for side in ("distopt", "pytorch"):
        last = [sps[-1] for sps, _ in runs[side]]
        first = statistics.median(sps[0] for sps, _ in runs[side])
        acc = statistics.median(acc for _, acc in runs[side])
        med[side] = statistics.median(last)
        print(f"{side:8} {med[side]:10.0f} {acc:9.4f} {first:10.0f}  "
              + " ".join(f"{v:.0f}" for v in last))
    print(f"ratio distopt/pytorch samples/s: {med['distopt'] / med['pytorch']:.2f} "
          "(target >= 1.0 at the same accuracy)")


if __name__ == "__main__":
    main()
