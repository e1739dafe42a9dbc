"""share/distopt/examples/python/train_mlp.py and train_ddp.py as a user runs
them: `distopt launch -n 2 -- python3 train_mlp.py --algorithm A`, for every
algorithm it offers, and PyTorch's DDP over the "distopt" backend (with
PyTorch's ZeroRedundancyOptimizer too), on a short run (60 steps of
Fashion-MNIST: about 80% measured; the floor, 70%, is far above chance,
10%)."""

import os
import re
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.environ.get("DISTOPT_SOURCE_DIR", ""), "share/distopt/examples/python")
EXAMPLE = os.path.join(EXAMPLES, "train_mlp.py")
DATA = "/usr/share/datasets/fashion-mnist"


@pytest.mark.parametrize("algorithm", ["allreduce", "zero", "zero3", "fused", "hybrid",
                                       "zero3 --bf16"])
def test_example_trains(algorithm):
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        pytest.skip(f"no Fashion-MNIST in {DATA} (tools/setup.sh installs it)")
    name, *flags = algorithm.split()
    r = subprocess.run([os.environ["DISTOPT_CLI"], "launch", "-n", "2", "--", sys.executable, EXAMPLE,
                        "--algorithm", name, "--epochs", "1", "--max-steps", "60"] + flags,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert r.returncode == 0, r.stdout
    shown = name + (", bf16" if flags else "")
    m = re.search(rf"\[rank 0\] epoch 1: test accuracy ([0-9.]+)% \({shown}, 2 ranks\)", r.stdout)
    assert m, r.stdout
    assert float(m.group(1)) > 70, r.stdout


@pytest.mark.parametrize("zero", [False, True])
def test_ddp_example_trains_over_distopt(zero):
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        pytest.skip(f"no Fashion-MNIST in {DATA} (tools/setup.sh installs it)")
    r = subprocess.run([os.environ["DISTOPT_CLI"], "launch", "-n", "2", "--", sys.executable,
                        os.path.join(EXAMPLES, "train_ddp.py"), "--epochs", "1", "--max-steps", "60"]
                       + (["--zero"] if zero else []),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert r.returncode == 0, r.stdout
    m = re.search(r"\[rank 0\] epoch 1: test accuracy ([0-9.]+)% \(DDP over distopt", r.stdout)
    assert m, r.stdout
    assert float(m.group(1)) > 70, r.stdout
