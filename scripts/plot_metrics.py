#!/usr/bin/python3
"""Plots a ddpv-train metrics file (--metrics run.jsonl) as a PNG: loss, accuracy, throughput.

    plot_metrics.py run.jsonl -o run.png

Reads the JSON-lines records of ddpv-train:
    {"event": "step",  "step", "epoch", "loss", "lr", "images_per_s", ...}
    {"event": "epoch", "epoch", "train_loss", "val_loss", "val_acc", "images_per_s", "elapsed_s"}
    {"event": "summary", ...}
and draws three panels: loss (training steps, per-epoch train and validation loss, checkpoints),
accuracy per epoch (train and validation), and images/s. Missing fields, null values (NaN or Inf in the run)
and unparseable lines (a run killed mid-line) are skipped, never fatal.
Exit codes: 0 ok, 1 error (one line on stderr), 2 usage.
"""
import argparse
import json
import math
import sys

PROG = "plot_metrics.py"


def number(record, key):
    """The finite float at record[key], or None."""
    v = record.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def read_records(path):
    records, bad = [], 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(r, dict):
                records.append(r)
            else:
                bad += 1
    return records, bad


def series(records, event, xkey, ykey):
    """(xs, ys) of records of one event that have both fields."""
    xs, ys = [], []
    for r in records:
        if r.get("event") != event:
            continue
        x, y = number(r, xkey), number(r, ykey)
        if x is not None and y is not None:
            xs.append(x)
            ys.append(y)
    return xs, ys


def step_epoch_axis(records, key):
    """(x, y) of step records on a fractional-epoch axis, so step and epoch curves share it.

    ddpv-train writes a step's "epoch" as epochs completed plus the fraction of the current one
    (2.25 = a quarter into the third epoch). Integer-only epochs (another writer) are spread over
    the epoch by step number instead.
    """
    steps = [r for r in records if r.get("event") == "step" and number(r, key) is not None
             and number(r, "epoch") is not None]
    if any(number(r, "epoch") != math.floor(number(r, "epoch")) for r in steps):
        return [number(r, "epoch") for r in steps], [number(r, key) for r in steps]
    by_epoch = {}
    for r in steps:
        if number(r, "step") is not None:
            by_epoch.setdefault(number(r, "epoch"), []).append(number(r, "step"))
    xs, ys = [], []
    for r in steps:
        e, s = number(r, "epoch"), number(r, "step")
        if s is None:
            continue
        lo, hi = min(by_epoch[e]), max(by_epoch[e])
        xs.append(e + ((s - lo + 1) / (hi - lo + 1) if hi > lo else 1.0))
        ys.append(number(r, key))
    return xs, ys


def plot(records, out, title):
    import matplotlib
    matplotlib.use("Agg")  # no display needed (clusters, CI)
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_acc, ax_speed) = plt.subplots(1, 3, figsize=(15, 4.2))
    # Epoch records carry the number of epochs completed, so epoch k is drawn at x = k.
    sx, sy = step_epoch_axis(records, "loss")
    if sx:
        ax_loss.plot(sx, sy, color="tab:blue", alpha=0.35, linewidth=0.8, label="train (steps)")
    for i, (x, _) in enumerate(zip(*series(records, "checkpoint", "epoch", "step"))):
        ax_loss.axvline(x, color="grey", linestyle=":", linewidth=0.8,
                        label="checkpoint" if i == 0 else None)
    for key, label, color in (("train_loss", "train (epoch)", "tab:blue"),
                              ("val_loss", "validation", "tab:orange")):
        x, y = series(records, "epoch", "epoch", key)
        if x:
            ax_loss.plot(x, y, marker="o", color=color, label=label)
    ax_loss.set_title("loss")
    ax_loss.set_xlabel("epoch")

    x, y = series(records, "epoch", "epoch", "train_acc")
    if x:
        ax_acc.plot(x, [100.0 * v for v in y], marker=".", color="tab:blue", label="train")
    x, y = series(records, "epoch", "epoch", "val_acc")
    if x:
        ax_acc.plot(x, [100.0 * v for v in y], marker="o", color="tab:green", label="validation")
        best = max(y)
        ax_acc.axhline(100.0 * best, color="grey", linestyle=":", linewidth=0.8)
        ax_acc.annotate(f"best {100.0 * best:.2f}%", (x[y.index(best)], 100.0 * best),
                        textcoords="offset points", xytext=(0, -14), ha="center", fontsize=8)
    ax_acc.set_title("accuracy (%)")
    ax_acc.set_xlabel("epoch")

    sx, sy = [], []
    for r in records:  # step throughput on the step axis when steps carry it
        if r.get("event") == "step" and number(r, "images_per_s") is not None:
            if number(r, "step") is not None:
                sx.append(number(r, "step"))
                sy.append(number(r, "images_per_s"))
    if sx:
        ax_speed.plot(sx, sy, color="tab:purple", linewidth=0.9, label="steps")
        ax_speed.set_xlabel("step")
    else:
        x, y = series(records, "epoch", "epoch", "images_per_s")
        if x:
            ax_speed.plot(x, y, marker="o", color="tab:purple", label="epochs")
        ax_speed.set_xlabel("epoch")
    summary = [r for r in records if r.get("event") == "summary"]
    if summary and number(summary[-1], "images_per_s") is not None:
        v = number(summary[-1], "images_per_s")
        ax_speed.axhline(v, color="grey", linestyle="--", linewidth=0.8, label=f"run {v:.0f}")
    ax_speed.set_title("throughput (images/s)")

    for ax in (ax_loss, ax_acc, ax_speed):
        ax.grid(True, alpha=0.3)
        if not ax.lines:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes,
                    color="grey")
        elif ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def describe(records, path):
    """Title line: model, ranks and the final numbers when a summary is present."""
    parts = [path]
    summary = [r for r in records if r.get("event") == "summary"]
    if summary:
        s = summary[-1]
        for key, fmt in (("model", "{}"), ("world_size", "{:.0f} ranks"),
                         ("global_batch", "batch {:.0f}"), ("val_acc", "val_acc {:.4f}"),
                         ("images_per_s", "{:.0f} img/s"), ("elapsed_s", "{:.0f} s")):
            v = s.get(key) if key == "model" else number(s, key)
            if isinstance(v, (str, float)):
                parts.append(fmt.format(v))
    return "  ·  ".join(parts)


def main(argv):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("metrics", help="a metrics file written by ddpv-train --metrics")
    ap.add_argument("-o", "--output", help="PNG to write (default: the input with .png)")
    args = ap.parse_args(argv)
    out = args.output or (args.metrics.rsplit(".", 1)[0] + ".png")
    try:
        records, bad = read_records(args.metrics)
    except OSError as e:
        print(f"{PROG}: error: cannot read {args.metrics}: {e.strerror or e}", file=sys.stderr)
        return 1
    if not records:
        print(f"{PROG}: error: {args.metrics} holds no JSON records", file=sys.stderr)
        return 1
    try:
        plot(records, out, describe(records, args.metrics))
    except ImportError as e:
        print(f"{PROG}: error: matplotlib is not importable by {sys.executable} ({e}); "
              "install Debian's python3-matplotlib", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"{PROG}: error: cannot write {out}: {e}", file=sys.stderr)
        return 1
    note = f" ({bad} unreadable lines skipped)" if bad else ""
    print(f"wrote {out} from {len(records)} records{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
