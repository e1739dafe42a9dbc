#!/usr/bin/env python3
"""Holds STATUS.md's "on the H200" column to the newest GPU smoke table.

Usage: check_gpu_claims.py SOURCE_DIR

The newest share/doc/distopt/gpu-runs/*-smoke-table.txt (by the date its
name opens with) is what last ran on a GPU. For each component row of
STATUS.md's table, the rows of that smoke table which exercise it (the map
below) decide what its "on the H200" cell may say:

- a cell that opens "yes" or "world size 1" claims a run: every mapped smoke
  row must be PASS;
- a cell that opens "no" claims none: no mapped smoke row may be PASS;
- a cell with "NAME: yes" / "NAME: no" parts (the fp16/bf16 reducers) is
  checked part by part.

It also fails on words that say a GPU path was never checked
("CUDA UNVERIFIED", "UNVERIFIED") in the public headers, the plugins' and
core's sources and the docs (the gpu-runs/ logs are records and exempt),
and when STATUS.md's "On a GPU" section does not name the newest run's date.
Standard library only.
"""

import os
import re
import sys

# STATUS.md's component (its bold name, backticks removed) -> smoke rows.
SMOKE_ROWS = {
    "nccl communicator": ["nccl_test", "allreduce"],
    "mean reducer": ["allreduce"],
    "fp16": ["reducer fp16"],
    "bf16": ["reducer bf16"],
    "signsgd reducer": ["reducer signsgd"],
    "topk reducer": ["reducer topk"],
    "randomk reducer": ["reducer randomk"],
    "powersgd reducer": ["powersgd"],
    "hierarchical reducer": ["reducer hierarchical"],
    "allreduce algorithm": ["allreduce"],
    "zero algorithm": ["zero"],
    "fused algorithm": ["fused"],
    "decentralized algorithm": ["decentralized"],
    "local_sgd algorithm": ["local_sgd"],
    "hybrid algorithm": ["hybrid f=0", "hybrid f=0.5", "hybrid f=1"],
    "Checkpoints": ["checkpoint"],
    "Elastic training": ["elastic"],
    "Mixed precision bf16": ["precision bf16"],
    "Mixed precision fp16": ["precision fp16"],
    "Python package": ["python allreduce", "python zero"],
    "torch.distributed backend distopt": ["python ddp"],
}

# Where "UNVERIFIED" may not stand: what a user or plugin author reads.
SCAN_DIRS = ["core/include", "sdk/include", "plugins", "core/src", "tools/distopt", "README.md",
             "share/doc/distopt"]
SCAN_EXEMPT = ["share/doc/distopt/gpu-runs"]


def newest_smoke_table(src):
    runs = os.path.join(src, "share/doc/distopt/gpu-runs")
    tables = sorted(f for f in os.listdir(runs) if f.endswith("-smoke-table.txt")
                    and re.match(r"\d{4}-\d{2}-\d{2}-", f))
    if not tables:
        sys.exit("FAIL: no gpu-runs/YYYY-MM-DD-*-smoke-table.txt")
    name = tables[-1]
    rows = {}
    with open(os.path.join(runs, name)) as f:
        for line in f:
            m = re.match(r"^(\S.*?)\s{2,}(PASS|FAIL|SKIP|UNSUPPORTED)\b", line)
            if m:
                rows[m.group(1).strip()] = m.group(2)
    if not rows:
        sys.exit(f"FAIL: gpu-runs/{name}: no row with a status")
    return name, rows


def status_rows(src):
    """(component, H200 cell) for each row of STATUS.md's components table."""
    with open(os.path.join(src, "share/doc/distopt/STATUS.md")) as f:
        text = f.read()
    table = text[text.index("## Components"):]
    out = []
    for line in table.splitlines():
        if not line.startswith("| **"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = re.sub(r"\*\*|`", "", cells[0]).strip()
        out.append((name, cells[2], text))
    return text, out


def claims(cell):
    """[(part name or None, True/False)] for a cell: yes/world size 1 vs no."""
    parts = re.findall(r"\b(\w+): (yes|no)\b", cell)
    if parts:
        return [(p, v == "yes") for p, v in parts]
    low = cell.lower()
    if low.startswith("yes") or low.startswith("world size 1"):
        return [(None, True)]
    if low.startswith("no"):
        return [(None, False)]
    return []  # n/a, or a cell that claims nothing about a GPU run


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "."
    table_name, smoke = newest_smoke_table(src)
    text, rows = status_rows(src)
    fail = []
    checked = 0
    for name, cell, _ in rows:
        for part, ran in claims(cell):
            key = part if part else next((k for k in SMOKE_ROWS if name.startswith(k)), None)
            if key is None or key not in SMOKE_ROWS:
                continue
            mapped = SMOKE_ROWS[key]
            states = {r: smoke.get(r, "absent") for r in mapped}
            checked += 1
            if ran and any(s != "PASS" for s in states.values()):
                fail.append(f"STATUS.md '{name}' says it ran on the H200 ({cell[:40]!r}), "
                            f"but {table_name} has {states}")
            if not ran and any(s == "PASS" for s in states.values()):
                fail.append(f"STATUS.md '{name}' says it did not run on the H200 ({cell[:40]!r}), "
                            f"but {table_name} has {states}: update STATUS.md")
    if checked < 10:
        fail.append(f"only {checked} STATUS.md claims matched the map of {sys.argv[0]}: "
                    "was the table reworded?")
    date = table_name[:10]
    gpu = text[text.index("## On a GPU"):text.index("## Components")]
    if date not in gpu:
        fail.append(f"STATUS.md's 'On a GPU' does not name the newest run ({date}, {table_name})")
    for d in SCAN_DIRS:
        root = os.path.join(src, d)
        files = [root] if os.path.isfile(root) else [
            os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs]
        for path in files:
            rel = os.path.relpath(path, src)
            if any(rel.startswith(e) for e in SCAN_EXEMPT):
                continue
            if not re.search(r"\.(hpp|h|cpp|md|py|sh)$", path):
                continue
            with open(path, errors="replace") as f:
                for n, line in enumerate(f, 1):
                    if "UNVERIFIED" in line:
                        fail.append(f"{rel}:{n}: says UNVERIFIED: say where it ran (STATUS.md) "
                                    "or that it never ran on a GPU")
    for f in fail:
        print("FAIL:", f)
    if fail:
        return 1
    print(f"PASS: {checked} claims of STATUS.md agree with {table_name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
