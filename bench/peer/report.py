#!/usr/bin/python3
"""The table of `make bench`: medians over rounds and ratios of ddpvision to PyTorch DDP, from
the raw results that scripts/bench.sh leaves in one directory (their files and how they are
read: bench/peer/raw_results.py).

    report.py RAW_DIR --md latest.md --png latest.png [--docs docs/performance.md]
              [--history bench/results/history.jsonl]

Prints the table, writes it as Markdown (with the machine) and draws the figures against their
targets as bar charts (Agg). With --history it appends one record of the table's figures to
that JSON-lines file (bench/peer/history.py; the schema in bench/plot_history.py), for a full
run only (incomplete() says what is not).
"""
import argparse
import json
import os
import statistics
import sys

import history
import precision
from raw_results import collect, time_to_target

GFLOP_PER_IMAGE = {"resnet20": 0.245, "lenet": 0.0665}  # training (3x forward), as model_bench
# Issue 7's targets: ours over PyTorch's images/s by model (at 1 and 2 ranks for lenet, 2 for
# resnet20), our scaling 1 -> 2 ranks, resnet20's share of the 2-rank sgemm roofline (%), and
# our time to 91% over PyTorch's.
THROUGHPUT_TARGET = {"lenet": 2.5, "resnet20": 1.2}
SCALING_TARGET = 1.95
ROOFLINE_TARGET = 90
TTA_TARGET = 0.33
DOC_START = "<!-- bench:table:start (scripts/bench.sh UPDATE_DOCS=1 writes this part) -->"
DOC_END = "<!-- bench:table:end -->"


def spread(values):
    """'median (min-max)' text and the median."""
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.0f}", med
    return f"{med:.0f} ({min(values):.0f}-{max(values):.0f})", med


def median_over_rounds(rounds):
    return statistics.median(rounds.values())


def judged(value, target, decimals=2, at_most=False):
    """value to `decimals` places, with one more where the rounded figure would read as meeting
    a target that value misses (1.946 against >= 1.95 is '1.946', not '1.95')."""
    text = f"{value:.{decimals}f}"
    misses = value > target if at_most else value < target
    reads_met = float(text) <= target if at_most else float(text) >= target
    return f"{value:.{decimals + 1}f}" if misses and reads_met else text


def ratio_row(name, ours_vals, their_vals, target):
    o_txt, o = spread(ours_vals)
    t_txt, t = spread(their_vals)
    ratio = o / t if t else float("nan")
    met = "" if target is None else ("yes" if ratio >= target else "no")
    target_txt = "" if target is None else f">= {target}x"
    shown = f"{ratio:.2f}" if target is None else judged(ratio, target)
    return [name, o_txt, t_txt, f"{shown}x", target_txt, met], ratio


def rounds_text(num, den, fmt, before=" (rounds ", after=")"):
    """Each round's num / den (dicts by round), in round order, for the rounds that have both;
    '' when fewer than two do. A run taken minutes from the other moves with the machine: the
    figure the text follows, a ratio of medians, is the one judged."""
    both = sorted(set(num) & set(den))
    if len(both) < 2:
        return ""
    return before + ", ".join(fmt(num[r] / den[r]) for r in both) + after


def each_round(values):
    """' (rounds a, b, ...)' of a dict of scalings by round, in round order; '' for one round."""
    if len(values) < 2:
        return ""
    return " (rounds " + ", ".join(ratio_x(values[r]) for r in sorted(values)) + ")"


def ratio_x(v):
    return f"{v:.2f}x"


def percent(v):
    return f"{100 * v:.0f}%"


def build_table(res, meta):
    """The table's rows, what the chart draws ({'throughput', 'scaling', 'roofline'}), and the
    sgemm peaks."""
    rows, chart = [], {"throughput": [], "scaling": []}
    for m, w in (("lenet", 1), ("lenet", 2), ("resnet20", 1), ("resnet20", 2)):
        target = THROUGHPUT_TARGET[m] if m == "lenet" or w == 2 else None
        row, ratio = ratio_row(f"{m} images/s, {w} rank{'s' if w > 1 else ''} x 1 thread",
                               res["ours"][(m, w)].values(), res["torch"][(m, w)].values(),
                               target)
        rows.append(row)
        chart["throughput"].append((f"{m} x{w}", median_over_rounds(res["ours"][(m, w)]),
                                    median_over_rounds(res["torch"][(m, w)]), ratio, target))
    for m in ("lenet", "resnet20"):
        so = median_over_rounds(res["ours"][(m, 2)]) / median_over_rounds(res["ours"][(m, 1)])
        st = median_over_rounds(res["torch"][(m, 2)]) / median_over_rounds(res["torch"][(m, 1)])
        scaling_row = [f"{m} scaling 1 -> 2 ranks",
                       f"{judged(so, SCALING_TARGET)}x" + rounds_text(res["ours"][(m, 2)],
                                                            res["ours"][(m, 1)], ratio_x),
                       f"{st:.2f}x" + rounds_text(res["torch"][(m, 2)], res["torch"][(m, 1)],
                                                  ratio_x),
                       f"{so / st:.2f}x",
                       f">= {SCALING_TARGET}x (ours)", "yes" if so >= SCALING_TARGET else "no"]
        rows.append(scaling_row)
        ceiling = sync = None
        if res["pair"][m]:  # what the machine allows two processes that never communicate
            one, two = res["ours"][(m, 1)], res["ours"][(m, 2)]
            values = []
            for name, pairs, of in (
                    (f"{m} ceiling: two independent 1-rank runs at once / 1 rank",
                     res["pair"][m], "the pair"),
                    (f"{m} synchronous ceiling: 2 x the slower of those two runs / 1 rank",
                     res["pair_sync"][m], "it")):
                pair = median_over_rounds(pairs)
                value = pair / median_over_rounds(one)
                share = 100 * median_over_rounds(two) / pair
                shares = rounds_text(two, pairs, percent, "; rounds ", "")
                rows.append([name, f"{value:.2f}x{rounds_text(pairs, one, ratio_x)} (2 ranks "
                             f"reach {share:.0f}% of {of}{shares})", "", "", "", ""])
                values.append(value)
            ceiling, sync = values
        step_sync = None
        probes = res["probe"][m]
        if probes:  # Note [The step-synchronous ceiling]
            one, two = res["ours"][(m, 1)], res["ours"][(m, 2)]
            step_sync = median_over_rounds(probes)
            of_it = {r: two[r] / one[r] / probes[r] for r in set(probes) & set(one) & set(two)}
            shares = ", ".join(percent(of_it[r]) for r in sorted(of_it))
            busier = [g for g in res["probe_gap"][m].values() if g is not None]
            busier_txt = ("; the busier rank +" + percent(statistics.median(busier))
                          if busier else "")
            rows.append([f"{m} step-synchronous ceiling: our step on 2 ranks, a barrier after "
                         "each, nothing exchanged / the same step on 1 rank, in the same seconds",
                         f"{step_sync:.2f}x{each_round(probes)} "
                         f"(our scaling is {100 * so / step_sync:.0f}% of it"
                         f"{'; rounds ' + shares if len(of_it) > 1 else ''}{busier_txt})",
                         "", "", "", ""])
        arith = None
        if res["arith"][m]:  # Note [The arithmetic ceiling]
            arith = median_over_rounds(res["arith"][m])
            rows.append([f"{m} arithmetic ceiling: arithmetic in registers as long as our step, "
                         "on 2 ranks with a barrier after each / the same alone, in the same "
                         "seconds",
                         f"{arith:.2f}x{each_round(res['arith'][m])}"
                         f"{arith_detail(res, m, step_sync, arith)}", "", "", "", ""])
        if so < SCALING_TARGET:  # a miss the machine decided, said where it is judged
            why = []
            if ceiling is not None and ceiling < SCALING_TARGET:
                why.append(f"the machine's ceiling in this run: {ceiling:.2f}x")
            if step_sync is not None and step_sync < SCALING_TARGET:
                why.append("a synchronous step with no communication scaled "
                           f"{judged(step_sync, SCALING_TARGET)}x"
                           f"{'' if why else ' in this run'}")
            if arith is not None and arith < SCALING_TARGET:
                why.append("even arithmetic in registers, synchronised so, scaled "
                           f"{judged(arith, SCALING_TARGET)}x"
                           f"{'' if why else ' in this run'}")
            if why:
                scaling_row[-1] = f"no ({'; '.join(why)})"
        gaps = res["busy_gap"][m]
        if gaps:  # the same asymmetry inside the 2-rank runs, from the trainer's own timers
            each = ", ".join(percent(gaps[r]) for r in sorted(gaps))
            rows.append([f"{m} 2-rank runs: the busier rank's work over the other's",
                         f"+{percent(statistics.median(gaps.values()))}"
                         f"{' (rounds ' + each + ')' if len(gaps) > 1 else ''}",
                         "", "", "", ""])
        chart["scaling"].append((m, so, st, ceiling, sync, step_sync, arith))
    peak1 = statistics.median(res["sgemm1"])
    peak = 2 * peak1
    g = GFLOP_PER_IMAGE["resnet20"]
    go = median_over_rounds(res["ours"][("resnet20", 2)]) * g
    gt = median_over_rounds(res["torch"][("resnet20", 2)]) * g
    rows.append(["resnet20 GFLOP/s, 2 ranks (% of 2-core sgemm peak)",
                 f"{go:.1f} ({judged(100 * go / peak, ROOFLINE_TARGET, 1)}%)",
                 f"{gt:.1f} ({100 * gt / peak:.1f}%)",
                 f"{go / gt:.2f}x", f">= {ROOFLINE_TARGET}% of peak (ours)",
                 "yes" if 100 * go >= ROOFLINE_TARGET * peak else "no"])
    chart["roofline"] = (100 * go / peak, 100 * gt / peak)
    return rows, chart, peak1, peak


def arith_detail(res, m, step_sync, arith):
    """The arithmetic row's parenthesis: the step-synchronous ceiling as a share of it, and how
    far a step's 90th percentile lies above its median (the wider rank, median over rounds)
    for arithmetic and for our step, together and alone, where the logs have them."""
    parts = []
    if step_sync is not None:
        parts.append(f"the step-synchronous ceiling is {100 * step_sync / arith:.0f}% of it")
    spreads = [(name, res[kind + "_spread"][m], res[kind + "_spread_alone"][m])
               for name, kind in (("arithmetic", "arith"), ("our step", "probe"))]

    def above(by_round):
        return f"+{percent(median_over_rounds(by_round) - 1)}"

    if all(s and a for _, s, a in spreads):
        parts.append("a step's 90th percentile over its median, together / alone: " + ", ".join(
            f"{name} {above(s)} / {above(a)}" for name, s, a in spreads))
    elif all(s for _, s, _ in spreads):  # logs from before the alone spreads
        parts.append("a step's 90th percentile over its median: " + ", ".join(
            f"{name} {above(s)}" for name, s, _ in spreads))
    return f" ({'; '.join(parts)})" if parts else ""


def tta_seconds(side):
    """Each round's time to the target, or None when a side did not run or missed it in a round."""
    if not side or any(r["hit"] is None for r in side):
        return None
    return [r["hit"]["elapsed_s"] for r in side]


def tta_row(ours, theirs, meta, balanced=False):
    """The time-to-accuracy row: each side's median over rounds (min-max), and the ratio of the
    medians; a side that missed the target in any round has no time. balanced: the row of our
    --balance runs, which shows no target (the target is judged on the default)."""
    def cell(side):
        if side is None:
            return "not run"
        missed = [i + 1 for i, r in enumerate(side) if r["hit"] is None]
        if missed:
            best = max((t["val_acc"] or 0 for i in missed for t in side[i - 1]["trace"]),
                       default=0)
            return (f"not reached in round{'s' if len(missed) > 1 else ''} "
                    f"{', '.join(map(str, missed))} of {len(side)} "
                    f"({len(side[missed[0] - 1]['trace'])} epochs; best {100 * best:.2f}%)")
        s = tta_seconds(side)
        epochs = sorted({r["hit"]["epoch"] for r in side})
        at = (f"epoch {epochs[0]}" if len(epochs) == 1
              else "epochs " + ", ".join(str(r["hit"]["epoch"]) for r in side))
        if len(s) == 1:
            return f"{s[0]:.1f} s ({at})"
        return f"{statistics.median(s):.1f} s ({min(s):.1f}-{max(s):.1f}; {at})"
    ratio, met = "", ""
    o, t = tta_seconds(ours), tta_seconds(theirs)
    if o and t:
        r = statistics.median(o) / statistics.median(t)
        ratio, met = f"{judged(r, TTA_TARGET, at_most=True)}x", "yes" if r <= TTA_TARGET else "no"
    elif ours and theirs:
        ratio = "n/a"
        met = ("n/a (neither reached it)" if not o and not t
               else "no" if not o else "yes (PyTorch did not reach it)")
    rounds = len(ours or theirs or [])
    name = (f"time to 91% test accuracy, Fashion-MNIST, lenet, 2 ranks (<= {meta['tta_epochs']} "
            f"epochs, median of {rounds} round{'s' if rounds != 1 else ''})")
    if balanced:
        return [name.replace("2 ranks", "2 ranks, ours with --balance"), cell(ours),
                cell(theirs), ratio, "", ""]
    return [name, cell(ours), cell(theirs), ratio, f"<= {TTA_TARGET}x", met]


def markdown(rows, res, peak1, peak, ours_tta, theirs_tta, balanced_tta, meta):
    head = ["figure", "ddpvision", "PyTorch DDP (best format)", "ours / PyTorch", "target", "met"]
    out = []
    if meta.get("quick"):
        out.append("**QUICK smoke run: a few steps, not a measurement.**\n")
    out.append(f"Measured {meta['date']} on {meta['cpu']} ({meta['cores']} cores), "
               f"{meta['rounds']} round(s), medians (min-max over rounds); batch {meta['batch']} "
               "per rank, 1 thread per rank, synthetic data.\n")
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for r in rows:
        out.append("| " + " | ".join(r) + " |")
    out.append("")
    out.append(f"sgemm peak (model_bench --sgemm-only: dnnl_sgemm 1024^3, best run; median "
               f"over rounds): 1 thread {peak1:.1f} GFLOP/s; the roofline of 2 ranks x 1 thread "
               f"is 2 x that = {peak:.1f} GFLOP/s; a 2-thread "
               f"sgemm gave {statistics.median(res['sgemm2']):.1f} GFLOP/s. resnet20 training is "
               "counted as 0.245 GFLOP per image.\n")
    if any(res["pair"].values()):
        out.append("Ceiling rows: two 1-rank runs of ours started together, which never "
                   "communicate; the middle half of each one's timed steps, their images/s "
                   "added (median over rounds), over the 1-rank median: what this machine "
                   "gives two processes at once, the reference for the scaling rows. "
                   "Synchronous ceiling rows: twice the slower of the two instead of their sum; "
                   "a trainer whose ranks wait for each other every step runs at the pace of "
                   "the slower rank, so where the machine gives two processes unequal shares of "
                   "its cores this is the most that synchronous data parallelism (ours or "
                   "PyTorch's) can reach on it. The busier-rank rows give the same asymmetry "
                   "inside the 2-rank runs: each rank's time in the loop less its waits for "
                   "the other and for data (ddpv-train's `rank_busy_s`), the busier over the "
                   "other, median over rounds. A scaling that missed where even the ceiling "
                   "sat below the target says so in its met column: no trainer could have met "
                   "it in that run.\n")
    if any(res["probe"].values()):
        out.append("Step-synchronous ceiling rows: `model_bench --sync-steps` on 2 ranks runs "
                   "our own training step (forward, loss, backward, SGD) on both with an MPI "
                   "barrier after each step and no gradient exchanged, and in between, in "
                   "blocks, the same steps on each rank alone while the other sleeps; the "
                   "trainer's step counts. Together over alone is what a synchronous trainer "
                   "with free communication could scale by on this machine in those seconds "
                   "(each step waits for the slower rank, whose speed jitters from step to "
                   "step), and our scaling over it is what our communication, shared update "
                   "and agreement cost, give or take the minutes between our runs.\n")
    if any(res["arith"].values()):
        out.append("Arithmetic ceiling rows: `model_bench --sync-steps --sync-arith`, the same "
                   "measurement with each step replaced by arithmetic in registers that lasts as "
                   "long as our step alone and touches no memory: what the machine itself costs "
                   "a synchronous step (its cores' speed jitters, and two busy cores run slower "
                   "than one). Where it sits below the target, no synchronous trainer of steps "
                   "that long could meet it on this machine in those seconds; the distance from "
                   "it down to the step-synchronous ceiling is what our step's own use of "
                   "memory costs a synchronous step here: its steps spread wider than "
                   "arithmetic's, and where they spread as wide alone as together (the 90th "
                   "percentiles in the row, together / alone), that spread is not the two "
                   "ranks contending for the caches but the machine's memory moving under "
                   "any step that uses it.\n")
    out.append("PyTorch by memory format (images/s, median):\n")
    out.append("| configuration | NCHW | channels_last |")
    out.append("|---|---|---|")
    for (m, w), fmts in res["torch_fmt"].items():
        cells = [f"{statistics.median(fmts[f]):.0f}" if f in fmts else "-"
                 for f in ("nchw", "channels_last")]
        out.append(f"| {m}, {w} rank{'s' if w > 1 else ''} | {cells[0]} | {cells[1]} |")
    out.append("")
    def note(t):  # the busier rank's lead, and the split under --balance
        parts = [f"+{percent(t['busy_gap'])}"] if t.get("busy_gap") is not None else []
        if t.get("split"):
            parts.append("split " + "/".join(str(n) for n in t["split"]))
        return f" ({'; '.join(parts)})" if parts else ""
    for name, side in (("ddpvision", ours_tta), ("ddpvision --balance", balanced_tta),
                       ("PyTorch", theirs_tta)):
        for i, run in enumerate(side or []):
            trace = ", ".join(f"{t['epoch']}: {100 * (t['val_acc'] or 0):.2f}% at "
                              f"{t['elapsed_s']:.0f} s{note(t)}" for t in run["trace"])
            out.append(f"- Fashion-MNIST trace, {name}"
                       f"{' (' + run['format'] + ')' if 'format' in run else ''}, round "
                       f"{i + 1}: {trace}")
    if any(t.get("busy_gap") is not None for run in ours_tta or [] for t in run["trace"]):
        out.append("\n(+n% in our traces: how much longer the busier rank worked than the other "
                   "in that epoch, from the epoch records' `rank_busy_s`; split a/b under "
                   "--balance: how the global batch of 128 was split between rank 0 and rank 1 "
                   "at the end of that epoch.)")
    out.append("")
    out.append(f"Versions: {meta['ddpv']}, oneDNN {meta['onednn']}, PyTorch {meta['torch']} "
               f"(gloo; BLAS {res['blas']}; malloc {res['allocator']}), {meta['mpi']}, "
               f"{meta['cxx']}, Python {meta['python']}, Linux "
               f"{meta['kernel']}. Load average at start {meta['load_start']}, at end "
               f"{meta['load_end']}; the run took {meta['wall_s'] / 60:.1f} min.")
    return "\n".join(out) + "\n"


def chart_png(chart, path, title):
    """Top: images/s and ours / PyTorch against the targets. Bottom: scaling with the machine's
    ceiling, resnet20's share of the roofline, and time to 91% (the red lines: targets).
    chart['tta'] is the two sides' median seconds, or a note saying why there are none."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(12, 8))
    grid = fig.add_gridspec(2, 4)
    a, b = fig.add_subplot(grid[0, :2]), fig.add_subplot(grid[0, 2:])
    c, d, e = fig.add_subplot(grid[1, :2]), fig.add_subplot(grid[1, 2]), fig.add_subplot(grid[1, 3])
    ours_col, torch_col = "tab:blue", "tab:orange"
    tp = chart["throughput"]
    xs = range(len(tp))
    for shift, i, label, col in ((-0.2, 1, "ddpvision", ours_col),
                                 (0.2, 2, "PyTorch DDP (best format)", torch_col)):
        a.bar_label(a.bar([x + shift for x in xs], [t[i] for t in tp], 0.4, label=label,
                          color=col), fmt="%.0f", fontsize=8)
    a.set_xticks(list(xs), [t[0] for t in tp])
    a.set_ylabel("training images/s (synthetic, 1 thread per rank)")
    a.legend()
    b.bar_label(b.bar(list(xs), [t[3] for t in tp], 0.5, color="tab:green"), fmt="%.2fx",
                fontsize=8)
    for x, t in zip(xs, tp):
        if t[4]:
            b.plot([x - 0.3, x + 0.3], [t[4], t[4]], "r-", lw=2)
    b.axhline(1.0, color="gray", lw=0.8)
    b.set_xticks(list(xs), [t[0] for t in tp])
    b.set_ylabel("ours / PyTorch (red: target)")
    sc = chart["scaling"]
    for x, (m, so, st, ceiling, sync, step_sync, arith) in enumerate(sc):
        bars = [(so, "ddpvision", ours_col), (st, "PyTorch DDP", torch_col)]
        if ceiling is not None:
            bars.append((ceiling, "two 1-rank runs at once (ceiling)", "tab:gray"))
        if sync is not None:
            bars.append((sync, "2 x the slower of them (synchronous ceiling)", "silver"))
        if step_sync is not None:
            bars.append((step_sync, "our step, a barrier after each, nothing exchanged",
                         "lightsteelblue"))
        if arith is not None:
            bars.append((arith, "arithmetic as long as our step, the same way", "lavender"))
        width = 0.8 / len(bars)
        for i, (v, label, col) in enumerate(bars):
            shift = (i - (len(bars) - 1) / 2) * width
            c.bar_label(c.bar(x + shift, v, width, color=col, label=label if x == 0 else None),
                        fmt="%.2fx", fontsize=8)
    c.axhline(SCALING_TARGET, color="red", lw=2, label=f"target {SCALING_TARGET}x (ours)")
    c.set_xticks(range(len(sc)), [f"{s[0]}, 1 -> 2 ranks" for s in sc])
    c.set_ylim(0, 3.0)  # room above the bars for the legend
    c.set_ylabel("scaling (2-rank / 1-rank images/s)")
    c.legend(fontsize=7, loc="upper center", ncol=2)
    ro, rt = chart["roofline"]
    d.bar_label(d.bar([0, 1], [ro, rt], 0.6, color=[ours_col, torch_col]), fmt="%.0f%%",
                fontsize=8)
    d.axhline(ROOFLINE_TARGET, color="red", lw=2)
    d.set_xticks([0, 1], ["ddpvision", "PyTorch"])
    d.set_ylabel("resnet20, 2 ranks: % of 2 x sgemm peak")
    d.set_title(f"red: target {ROOFLINE_TARGET}%", fontsize=9)
    tta = chart.get("tta", "not run")
    if not isinstance(tta, str):
        e.bar_label(e.bar([0, 1], list(tta), 0.6, color=[ours_col, torch_col]), fmt="%.0f s",
                    fontsize=8)
        e.plot([-0.3, 0.3], [TTA_TARGET * tta[1]] * 2, "r-", lw=2)
        e.set_xticks([0, 1], ["ddpvision", "PyTorch"])
    else:
        e.text(0.5, 0.5, tta, ha="center", va="center", transform=e.transAxes)
        e.set_xticks([])
        e.set_yticks([])
    e.set_ylabel("time to 91%, Fashion-MNIST, lenet x2 (s)")
    e.set_title(f"red: target, {TTA_TARGET} x PyTorch's", fontsize=9)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def update_docs(path, md):
    text = open(path).read()
    if DOC_START not in text or DOC_END not in text:
        raise ValueError(f"{path} has no bench table markers")
    pre, rest = text.split(DOC_START, 1)
    post = rest.split(DOC_END, 1)[1]
    with open(path, "w") as f:
        f.write(pre + DOC_START + "\n" + md + DOC_END + post)


def incomplete(res, meta, ours_tta, theirs_tta, balanced_tta):
    """Why the run is not a full `make bench` run, or None where it is. A full run is not
    QUICK (a smoke test of a few steps, not a measurement), ran the time-to-91% part (not
    SKIP_TTA), and has every round of what its targets are judged on: each throughput
    configuration of both sides and the sgemm peak in all of meta's rounds, and each side's
    time-to-91% runs (ours, PyTorch's and ours under --balance) in all of its tta_rounds. A
    side that ran but missed 91% is a result, not a gap. scripts/bench.sh stops at the first
    failed run before it calls this script, so a gap here is a raw directory put together or
    cut by hand. The ceiling and probe rows are context, judged on nothing, and not required."""
    if meta.get("quick"):
        return "a QUICK smoke run"
    if meta.get("skip_tta"):
        return "SKIP_TTA=1: no time to 91%"
    n = meta.get("rounds")
    for side, name in (("ours", "ddpvision"), ("torch", "PyTorch")):
        for (m, w), by_round in res[side].items():
            if len(by_round) != n:
                return f"{name} {m} at {w} rank(s) has {len(by_round)} of {n} rounds"
    if len(res["sgemm1"]) != n:
        return f"the sgemm peak has {len(res['sgemm1'])} of {n} rounds"
    k = meta.get("tta_rounds")  # absent in raw results from before it was recorded
    for name, side in (("ddpvision", ours_tta), ("PyTorch", theirs_tta),
                       ("ddpvision --balance", balanced_tta)):
        if not side:
            return f"no time-to-91% runs of {name}"
        if k is not None and len(side) != k:
            return f"{len(side)} of {k} time-to-91% rounds of {name}"
    return None


def main(argv):
    p = argparse.ArgumentParser(prog="report.py", description=__doc__.split("\n")[0])
    p.add_argument("raw")
    p.add_argument("--md", required=True)
    p.add_argument("--png", required=True)
    p.add_argument("--docs", default="", help="also replace the table in this Markdown file")
    p.add_argument("--history", default="",
                   help="append the run's record to this JSON-lines file (full runs only)")
    a = p.parse_args(argv)
    meta = json.load(open(os.path.join(a.raw, "meta.json")))
    res = collect(a.raw)
    rows, chart, peak1, peak = build_table(res, meta)
    ours_tta, theirs_tta, balanced_tta = time_to_target(a.raw)
    if not meta.get("skip_tta"):
        rows.append(tta_row(ours_tta, theirs_tta, meta))
        if balanced_tta:
            rows.append(tta_row(balanced_tta, theirs_tta, meta, balanced=True))
        o, t = tta_seconds(ours_tta), tta_seconds(theirs_tta)
        if o and t:
            chart["tta"] = (statistics.median(o), statistics.median(t))
        elif ours_tta or theirs_tta:
            chart["tta"] = "the target not reached\nin every round"
    md = markdown(rows, res, peak1, peak, ours_tta, theirs_tta, balanced_tta, meta)
    prec = precision.markdown(a.raw)  # the precision rows, when the run made them
    if prec:
        md += "\n" + prec
    with open(a.md, "w") as f:
        f.write("# ddpvision vs PyTorch DDP (`make bench`)\n\n" + md)
    chart_png(chart, a.png, f"ddpvision vs PyTorch DDP, {meta['cpu']}, {meta['date']}"
              + (" (QUICK smoke run)" if meta.get("quick") else ""))
    if a.docs:
        update_docs(a.docs, md)
    appended = ""
    if a.history:  # last, so that a record means its table was written
        why = incomplete(res, meta, ours_tta, theirs_tta, balanced_tta)
        if why:
            print(f"report.py: {a.history}: no record appended: {why}", file=sys.stderr)
        else:
            history.append(a.history, history.record(rows, meta, statistics.median(res["sgemm1"]),
                                                     res["allocator"]))
            appended = f"; one record appended to {a.history}"
    widths = [max(len(r[i]) for r in rows + [["figure", "ddpvision", "PyTorch", "ratio",
                                                "target", "met"]]) for i in range(6)]
    print()
    for r in [["figure", "ddpvision", "PyTorch", "ratio", "target", "met"]] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    print(f"\nwritten: {a.md}, {a.png}" + (f", {a.docs}" if a.docs else "") + appended)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (OSError, ValueError, KeyError) as e:
        print(f"report.py: {e}", file=sys.stderr)
        sys.exit(1)
