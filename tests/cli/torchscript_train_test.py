#!/usr/bin/python3
"""Your own model and data in `distopt train`, as a PyTorch user brings them.

A model written in Python is scripted (torch.jit.script) and saved, a
dataset is saved with torch.save, and `distopt train` trains that model on
that data on 2 ranks (train.model: {torchscript: ...}, dataset: tensors).
Checks: it reaches the accuracy of the same model trained by a plain
PyTorch loop (same initial weights, batch, learning rate and steps; the
sample order differs), its checkpoint consolidates into a file whose
"model" dict loads into the Python model with load_state_dict(strict=True),
and that model's test accuracy is the one distopt reported. Then the
refusals a user may meet: a missing file, and a file that is not
TorchScript.

Run by ctest with DISTOPT_CLI and DISTOPT_PLUGIN_DIR set; exit 77 (skip)
when this Python has no torch.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("skipped: no torch for", sys.executable)
    sys.exit(77)

CLI = os.environ["DISTOPT_CLI"]
PLUGINS = os.environ["DISTOPT_PLUGIN_DIR"]
FEATURES, CLASSES = 32, 4
EPOCHS, BATCH, LR = 3, 64, 0.1


class Net(nn.Module):
    """A user's model: submodules, a buffer, and a forward with some logic."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 32))
        self.head = nn.Linear(32, CLASSES)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x):
        h = F.relu(self.body(x * self.scale * 2.0))
        return self.head(h)


def make_data(n, gen):
    """Overlapping Gaussian blobs (about 85% is reachable; chance is 25%)."""
    centres = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(7)) * 0.45
    labels = torch.randint(0, CLASSES, (n,), generator=gen)
    inputs = centres[labels] + torch.randn(n, FEATURES, generator=gen)
    return inputs, labels


def accuracy(model, inputs, labels):
    model.eval()
    with torch.no_grad():
        return (model(inputs).argmax(1) == labels).float().mean().item()


def run(argv, expect_ok=True):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600)
    if expect_ok and r.returncode != 0:
        print(r.stdout)
        raise SystemExit(f"FAIL: {' '.join(argv)} exited {r.returncode}")
    return r


def main():
    work = tempfile.mkdtemp(prefix="distopt_torchscript_")
    try:
        check(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def check(work):
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    train_x, train_y = make_data(4096, gen)
    test_x, test_y = make_data(1024, gen)
    torch.save({"inputs": train_x, "labels": train_y}, f"{work}/train.pt")
    torch.save((test_x, test_y), f"{work}/test.pt")  # the tuple form too

    net = Net()
    init = {k: v.clone() for k, v in net.state_dict().items()}
    torch.jit.save(torch.jit.script(net), f"{work}/model.pt")

    # The plain PyTorch loop: global batch BATCH, plain SGD, shuffled epochs.
    ref = Net()
    ref.load_state_dict(init)
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    order = torch.Generator().manual_seed(3)
    for _ in range(EPOCHS):
        ref.train()
        perm = torch.randperm(len(train_x), generator=order)
        for i in range(0, len(perm) - BATCH + 1, BATCH):
            idx = perm[i:i + BATCH]
            opt.zero_grad()
            F.cross_entropy(ref(train_x[idx]), train_y[idx]).backward()
            opt.step()
    ref_acc = accuracy(ref, test_x, test_y)
    print(f"plain PyTorch: test accuracy {100 * ref_acc:.2f}%")

    # The same job in distopt: relative paths, against the job file.
    with open(f"{work}/job.yaml", "w") as f:
        f.write(f"""plugins: {{paths: ['{PLUGINS}']}}
world: {{size: 2}}
communicator: tcp
reducer: mean
algorithm: allreduce
optimizer: {{name: sgd, lr: {LR}}}
train: {{model: {{torchscript: model.pt}}, dataset: tensors,
         tensors: {{train: train.pt, test: test.pt}},
         epochs: {EPOCHS}, global_batch_size: {BATCH}, batch_size: {BATCH // 2},
         log_every: 20, seed: 5}}
""")
    r = run([CLI, "check", f"{work}/job.yaml"])
    r = run([CLI, "train", f"{work}/job.yaml", "--checkpoint", f"{work}/ck",
             "--metrics", f"{work}/m.jsonl"])
    print(r.stdout)
    summary = [json.loads(l) for l in open(f"{work}/m.jsonl") if l.strip()][-1]
    got = summary["final_test_accuracy"]
    print(f"distopt train: test accuracy {100 * got:.2f}%")
    assert summary["world_size"] == 2, summary
    # It learnt (chance: 25%; both reach about 85%), and as well as the plain
    # loop: 3 points' margin for another sample order (measured 2026-11-29:
    # 85.74% vs 84.86%).
    assert got > 0.75, f"FAIL: distopt reached {100 * got:.2f}%"
    assert got >= ref_acc - 0.03, f"FAIL: distopt {100 * got:.2f}% vs PyTorch {100 * ref_acc:.2f}%"

    # The consolidated file loads into the Python model, at distopt's accuracy.
    run([CLI, "checkpoint", "consolidate", f"{work}/ck", f"{work}/out.pt"])
    ck = torch.load(f"{work}/out.pt")
    back = Net()
    back.load_state_dict(ck["model"], strict=True)
    back_acc = accuracy(back, test_x, test_y)
    print(f"consolidated into the PyTorch model: test accuracy {100 * back_acc:.2f}%")
    assert abs(back_acc - got) < 0.002, f"FAIL: {back_acc} vs {got}"
    assert not torch.equal(back.head.weight, init["head.weight"]), "FAIL: not trained"
    assert torch.equal(back.scale, init["scale"]), "FAIL: the buffer changed"

    # distopt eval of the same checkpoint says the same.
    r = run([CLI, "eval", f"{work}/job.yaml", "--checkpoint", f"{work}/ck", "--world-size", "1"])
    m = re.search(r"test accuracy ([0-9.]+)%", r.stdout)
    assert m and abs(float(m.group(1)) - 100 * got) < 0.01, r.stdout

    # Refusals, naming the key and the file.
    with open(f"{work}/job.yaml") as f:
        job = f.read()
    with open(f"{work}/missing.yaml", "w") as f:
        f.write(job.replace("model.pt", "nothere.pt"))
    r = run([CLI, "train", f"{work}/missing.yaml"], expect_ok=False)
    assert r.returncode != 0 and "train.model.torchscript" in r.stdout and "nothere.pt" in r.stdout, \
        r.stdout
    with open(f"{work}/bad.yaml", "w") as f:
        f.write(job.replace("model.pt", "train.pt"))  # a tensor file, not TorchScript
    r = run([CLI, "train", f"{work}/bad.yaml"], expect_ok=False)
    assert r.returncode != 0 and "not a TorchScript file" in r.stdout, r.stdout
    print("PASS")


if __name__ == "__main__":
    main()
