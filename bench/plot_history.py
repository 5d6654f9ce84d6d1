#!/usr/bin/python3
"""Plots the `make bench` history (bench/results/history.jsonl) over time: ours over PyTorch's
images/s, our scaling from 1 to 2 ranks, resnet20's share of the sgemm roofline and our time
to 91% over PyTorch's, each against its target (one PNG, matplotlib Agg).

    bench/plot_history.py [bench/results/history.jsonl] [--out bench/results/history.png]

The history file holds one JSON object per line, one line per full `make bench` run, appended
by bench/peer/report.py --history (scripts/bench.sh passes it; QUICK and SKIP_TTA runs are not
appended). Every record has these keys (null where a run did not record one):

    when             "2026-12-05T18:27Z", the run's start (UTC)
    cpu, cores       lscpu's model name ("AMD EPYC") and the online cores (2)
    simd             "avx512" or "avx2": the widest vectors the CPU has
    rounds           throughput rounds (ROUNDS); tta_rounds: time-to-91% rounds (TTA_ROUNDS)
    sgemm_1t_gflops  the single-thread sgemm peak of the run (median over rounds)
    peer_allocator   PyTorch's malloc as latest.md names it; runs whose peer ran under glibc's
                     malloc as it comes ("system (...)") overstate our ratios to PyTorch
                     about 2-2.5x (docs/performance.md, "Method")
    load_start, load_end  the 1-minute load average at the start and at the end
    wall_min         minutes the run took
    commit, dirty    `git rev-parse --short=12 HEAD` of the measured tree, and whether tracked
                     files differed from it
    source           "scripts/bench.sh", or where a record seeded from the past came from
    figures          {key: {"ours": n, "peer": n, "ratio": n, "met": bool}}, each number as
                     the run's table printed it; a key or a sub-key the run lacks is absent

Figure keys (M is lenet or resnet20; "met" only where the table judges a target):
    M_1rank_ips, M_2rank_ips    images/s, ours and PyTorch's, and ours / PyTorch's
    M_scaling                   2-rank over 1-rank images/s, each side, and ours / PyTorch's
    M_ceiling, M_sync_ceiling, M_step_sync_ceiling, M_arith_ceiling
                                the ceiling rows' scalings (ours only)
    M_busier_rank_pct           the busier rank's work over the other's in 2-rank runs, %
    resnet20_2rank_gflops       GFLOP/s at 2 ranks, each side, and ours / PyTorch's
    resnet20_roofline_pct       those GFLOP/s as % of 2 x the single-thread sgemm peak
    tta91_s, tta91_balanced_s   seconds to 91% on Fashion-MNIST (ours, the latter with
                                --balance), PyTorch's, and ours / PyTorch's

A missing or malformed file stops the script with one line naming the file (and the line)
and exit status 1.
"""
import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer"))
from report import ROOFLINE_TARGET, SCALING_TARGET, THROUGHPUT_TARGET, TTA_TARGET  # noqa: E402



def glibc_peer(rec):
    """Whether the run's peer ran under glibc's malloc as it comes ("system (...)" in
    report.py's words): its ratios to PyTorch overstate ours (Note [Peer allocator])."""
    return str(rec.get("peer_allocator") or "").startswith("system")


class HistoryError(Exception):
    pass


def read_history(path):
    """The records of a history file, checked line by line; HistoryError names the file and
    the line of the first problem. Blank lines are skipped."""
    try:
        lines = open(path).read().splitlines()
    except FileNotFoundError:
        raise HistoryError(f"{path}: no such file")
    except (OSError, UnicodeDecodeError) as e:
        raise HistoryError(f"{path}: cannot read it: {e}")
    records = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise HistoryError(f"{where}: not JSON ({e})")
        if not isinstance(rec, dict):
            raise HistoryError(f"{where}: not a JSON object")
        try:
            rec["_when"] = datetime.datetime.strptime(rec.get("when") or "", "%Y-%m-%dT%H:%MZ")
        except (TypeError, ValueError):
            raise HistoryError(f"{where}: 'when' is {json.dumps(rec.get('when'))}, not "
                               "YYYY-MM-DDTHH:MMZ")
        figures = rec.get("figures")
        if not isinstance(figures, dict):
            raise HistoryError(f"{where}: no 'figures' object")
        for key, fig in figures.items():
            if not isinstance(fig, dict):
                raise HistoryError(f"{where}: figure '{key}' is not an object")
            for sub, v in fig.items():
                ok = (isinstance(v, bool) if sub == "met" else
                      isinstance(v, (int, float)) and not isinstance(v, bool))
                if sub not in ("ours", "peer", "ratio", "met") or not ok:
                    raise HistoryError(f"{where}: figure '{key}' has {sub} = {json.dumps(v)}")
        records.append(rec)
    if not records:
        raise HistoryError(f"{path}: no records")
    return records


# (title, [(figure key, sub-key, label, target)], y label)
PANELS = [
    ("ours / PyTorch, images/s (hollow: PyTorch under glibc's malloc as it comes)",
     [("lenet_1rank_ips", "ratio", "lenet, 1 rank", THROUGHPUT_TARGET["lenet"]),
      ("lenet_2rank_ips", "ratio", "lenet, 2 ranks", None),
      ("resnet20_1rank_ips", "ratio", "resnet20, 1 rank", None),
      ("resnet20_2rank_ips", "ratio", "resnet20, 2 ranks", THROUGHPUT_TARGET["resnet20"])],
     "ours / PyTorch"),
    ("our scaling, 1 -> 2 ranks, and the machine's arithmetic ceiling",
     [("lenet_scaling", "ours", "lenet", SCALING_TARGET),
      ("resnet20_scaling", "ours", "resnet20", None),
      ("lenet_arith_ceiling", "ours", "arithmetic ceiling, lenet's step", None),
      ("resnet20_arith_ceiling", "ours", "arithmetic ceiling, resnet20's step", None)],
     "2-rank / 1-rank images/s"),
    ("resnet20 at 2 ranks, % of 2 x the single-thread sgemm peak",
     [("resnet20_roofline_pct", "ours", "ddpvision", ROOFLINE_TARGET)],
     "% of the roofline"),
    ("time to 91% on Fashion-MNIST, ours / PyTorch's (PyTorch's allocator did not move it)",
     [("tta91_s", "ratio", "default split", TTA_TARGET),
      ("tta91_balanced_s", "ratio", "--balance", None)],
     "ours / PyTorch"),
]
PEER_PANELS = {0}  # the synthetic ratios to PyTorch, which the peer's allocator moved


def plot(records, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    records = sorted(records, key=lambda r: r["_when"])
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(12, 3.2 * len(PANELS)), sharex=True)
    for i, (ax, (title, series, ylabel)) in enumerate(zip(axes, PANELS)):
        for j, (key, sub, label, target) in enumerate(series):
            pts = [(r["_when"], r["figures"][key][sub], glibc_peer(r))
                   for r in records if sub in r["figures"].get(key, {})]
            if not pts:
                continue
            color = f"C{j}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color=color, lw=0.8,
                    label=label)
            mark = i in PEER_PANELS  # hollow where the peer ran under glibc as it comes
            for hollow in (False, True):
                sel = [p for p in pts if (mark and p[2]) == hollow]
                if sel:
                    ax.plot([p[0] for p in sel], [p[1] for p in sel], "o", ms=4, color=color,
                            mfc="none" if hollow else color)
            if target is not None:
                ax.axhline(target, color="red", lw=1.5, ls="--")
        ax.set_title(title + " (red: target)", fontsize=10)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    axes[-1].set_xlabel(f"run start (UTC); {len(records)} runs, "
                        f"{records[0]['when']} to {records[-1]['when']}")
    fig.autofmt_xdate()
    fig.suptitle("ddpvision vs PyTorch DDP, every `make bench` run")
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def main(argv):
    p = argparse.ArgumentParser(prog="plot_history.py", description=__doc__.split("\n")[0])
    p.add_argument("history", nargs="?", default="bench/results/history.jsonl")
    p.add_argument("--out", default="bench/results/history.png", help="the PNG to write")
    a = p.parse_args(argv)
    # `make bench-data` records (kind "data") hold the input pipeline's figures, none of the
    # training ones drawn here: they would only swell the count of runs.
    records = [r for r in read_history(a.history) if r.get("kind") != "data"]
    plot(records, a.out)
    print(f"plot_history.py: {len(records)} runs from {a.history} drawn in {a.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except HistoryError as e:
        print(f"plot_history.py: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:  # the PNG could not be written
        print(f"plot_history.py: {e}", file=sys.stderr)
        sys.exit(1)
