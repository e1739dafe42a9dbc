#!/usr/bin/python3
"""Draw the curves of one or several `distopt train --metrics FILE` runs.

Usage: tools/plot_metrics.py RUN.jsonl [RUN2.jsonl ...] -o curves.png
       [--label NAME ...] [--x global_step|epoch]

One PNG with four panels against the optimizer step (the metrics' global
step): the training loss (rank 0's loss every train.log_every steps, and
each epoch's mean over ranks), the test accuracy after each epoch, the
learning rate, and the throughput (samples/s over all ranks). Each file is
one line per panel, labelled by its file name or --label, so two runs
compare at a glance. A resumed run's file (appended to) draws as one run.

Needs matplotlib (Debian: python3-matplotlib; tools/setup.sh installs it).
Exit status: 0 drawn, 1 a file without any step or epoch record, 2 usage.
"""

import argparse
import json
import os
import sys


def read_run(path):
    """The step and epoch records of a metrics file, in order."""
    steps, epochs = [], []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"plot_metrics: {path}:{n}: not JSON ({e})")
            kind = rec.get("event")
            if kind == "step":
                steps.append(rec)
            elif kind == "epoch":
                epochs.append(rec)
    return steps, epochs


def series(records, x, y):
    """(xs, ys) of the records that have both keys."""
    pts = [(r[x], r[y]) for r in records if x in r and y in r and r[y] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Draw loss, accuracy, learning rate and throughput of distopt runs.")
    ap.add_argument("files", nargs="+", help="metrics files (distopt train --metrics)")
    ap.add_argument("-o", "--output", required=True, help="the PNG to write")
    ap.add_argument("--label", action="append", default=[],
                    help="a name per file, in order (default: the file names)")
    ap.add_argument("--x", choices=["global_step", "epoch"], default="global_step",
                    help="the horizontal axis (default: global_step)")
    args = ap.parse_args(argv)
    if args.label and len(args.label) != len(args.files):
        ap.error(f"{len(args.label)} --label for {len(args.files)} files")

    import matplotlib
    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    (ax_loss, ax_acc), (ax_lr, ax_sps) = axes
    x = args.x
    for i, path in enumerate(args.files):
        steps, epochs = read_run(path)
        if not steps and not epochs:
            print(f"plot_metrics: {path}: no step or epoch records "
                  "(written by distopt train --metrics?)", file=sys.stderr)
            return 1
        name = args.label[i] if args.label else os.path.basename(path)
        color = f"C{i % 10}"
        step_x = "global_step" if x == "global_step" else "epoch"
        xs, ys = series(steps, step_x, "loss")
        if xs:
            ax_loss.plot(xs, ys, color=color, alpha=0.5, linewidth=1, label=f"{name} (rank 0)")
        xs, ys = series(epochs, x, "train_loss")
        if xs:
            ax_loss.plot(xs, ys, color=color, marker="o", label=f"{name} (epoch mean)")
        xs, ys = series(epochs, x, "test_accuracy")
        if xs:
            ax_acc.plot(xs, [100 * y for y in ys], color=color, marker="o", label=name)
        xs, ys = series(steps, step_x, "lr") if steps else series(epochs, x, "lr")
        if xs:
            ax_lr.plot(xs, ys, color=color, label=name)
        xs, ys = series(steps, step_x, "samples_per_s")
        if not xs:
            xs, ys = series(epochs, x, "samples_per_s")
        if xs:
            ax_sps.plot(xs, ys, color=color, marker=".", label=name)

    xlabel = "optimizer step" if x == "global_step" else "epoch"
    for ax, title, ylabel in ((ax_loss, "training loss", "loss"),
                              (ax_acc, "test accuracy", "%"),
                              (ax_lr, "learning rate", "lr"),
                              (ax_sps, "throughput (all ranks)", "samples/s")):
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    print(f"plot_metrics: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
