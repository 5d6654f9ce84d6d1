"""The run-by-run history of `make bench`: one JSON record per full run, appended to
bench/results/history.jsonl by bench/peer/report.py --history (the schema: the docstring of
bench/plot_history.py, which plots the file).

A record's figures are read back from the table's own cells, the same text that latest.md
shows, so the history holds exactly the numbers the table printed (rounded as printed).
"""
import json
import re

# Row names of the table (bench/peer/report.py) by prefix, and the figure key each gives.
# Prefixes are matched in order; "lenet ceiling:" and "lenet synchronous ceiling:" differ
# before their colon, so no prefix swallows another.
_ROWS = []
for _m in ("lenet", "resnet20"):
    _ROWS += [(f"{_m} images/s, 1 rank", f"{_m}_1rank_ips", "ratio"),
              (f"{_m} images/s, 2 ranks", f"{_m}_2rank_ips", "ratio"),
              (f"{_m} scaling 1 -> 2 ranks", f"{_m}_scaling", "ratio"),
              (f"{_m} ceiling:", f"{_m}_ceiling", "ours"),
              (f"{_m} synchronous ceiling:", f"{_m}_sync_ceiling", "ours"),
              (f"{_m} step-synchronous ceiling:", f"{_m}_step_sync_ceiling", "ours"),
              (f"{_m} arithmetic ceiling:", f"{_m}_arith_ceiling", "ours"),
              (f"{_m} 2-rank runs: the busier rank", f"{_m}_busier_rank_pct", "ours")]
_ROWS += [("resnet20 GFLOP/s, 2 ranks", "resnet20_2rank_gflops", "roofline"),
          ("time to 91% test accuracy, Fashion-MNIST, lenet, 2 ranks, ours with --balance",
           "tta91_balanced_s", "ratio"),
          ("time to 91% test accuracy", "tta91_s", "ratio")]
_NUMBER = re.compile(r"[-+]?[0-9]+(?:\.[0-9]+)?")


def _first_number(cell):
    """The cell's leading figure: '5771 (5715-5794)' -> 5771, '+2% (rounds ...)' -> 2,
    '2.18x (rounds ...)' -> 2.18 (an int where the cell printed no decimals); None where it
    starts with none ('not run', 'n/a', 'not reached in round 2 of 3 ...', '')."""
    m = _NUMBER.match(cell.strip())
    if not m:
        return None
    text = m.group(0)
    return float(text) if "." in text else int(text)


def figures(rows):
    """{figure key: {ours, peer, ratio, met}} of the table's rows (lists of its six cells),
    each value the number its cell printed; a cell without a number (not run, n/a, a target
    not reached) leaves its key out, and a row the table lacks leaves its figure out."""
    out = {}
    for row in rows:
        name, ours, peer, ratio, _target, met = (list(row) + [""] * 6)[:6]
        match = next(((key, kind) for prefix, key, kind in _ROWS if name.startswith(prefix)),
                     None)
        if match is None:
            continue
        key, kind = match
        fig = {k: v for k, v in (("ours", _first_number(ours)), ("peer", _first_number(peer)))
               if v is not None}
        if kind in ("ratio", "roofline") and _first_number(ratio) is not None:
            fig["ratio"] = _first_number(ratio)
        judged = met.startswith(("yes", "no"))
        if kind == "roofline":  # 'GFLOP/s (share%)': the share of the roofline is judged
            pct = {}
            for k, cell in (("ours", ours), ("peer", peer)):
                m = re.search(r"\(([0-9.]+)%\)", cell)
                if m:
                    pct[k] = float(m.group(1))
            if judged:
                pct["met"] = met.startswith("yes")
            if pct:
                out["resnet20_roofline_pct"] = pct
        elif judged:
            fig["met"] = met.startswith("yes")
        if fig:
            out[key] = fig
    return out


def table_rows(md):
    """The rows of the first table of a latest.md text (the one headed '| figure |'), as
    lists of cells: what figures() reads, for records made from a stored latest.md."""
    rows, inside = [], False
    for line in md.splitlines():
        if line.startswith("| figure |"):
            inside = True
            continue
        if inside:
            if not line.startswith("|"):
                break
            if line.startswith("|---"):
                continue
            rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def when_iso(date):
    """'2026-12-05 18:27 UTC' (bench.sh's date) -> '2026-12-05T18:27Z'."""
    m = re.fullmatch(r"([0-9]{4}-[0-9]{2}-[0-9]{2}) ([0-9]{2}:[0-9]{2})(?::[0-9]{2})? UTC",
                     date.strip())
    if not m:
        raise ValueError(f"not a bench.sh date: '{date}'")
    return f"{m.group(1)}T{m.group(2)}Z"


def _first_float(text):
    m = _NUMBER.search(text or "")
    return float(m.group(0)) if m else None


def record(rows, meta, sgemm_1t, peer_allocator, source="scripts/bench.sh"):
    """The history record of one run: its table's figures and what names the run."""
    cores = meta.get("cores")
    return {
        "when": when_iso(meta["date"]),
        "cpu": meta.get("cpu") or None,
        "cores": int(cores) if str(cores or "").isdigit() else None,
        "simd": meta.get("simd") or None,
        "rounds": meta.get("rounds"),
        "tta_rounds": meta.get("tta_rounds"),
        "sgemm_1t_gflops": round(sgemm_1t, 1) if sgemm_1t is not None else None,
        "peer_allocator": peer_allocator or None,
        "load_start": _first_float(meta.get("load_start")),
        "load_end": _first_float(meta.get("load_end")),
        "wall_min": round(meta["wall_s"] / 60, 1) if meta.get("wall_s") is not None else None,
        "commit": meta.get("commit") or None,
        "dirty": meta.get("dirty") if meta.get("commit") else None,
        "source": source,
        "figures": figures(rows),
    }


def append(path, rec):
    """Appends rec as one line; the file and its folder must exist or be creatable."""
    with open(path, "a") as f:
        f.write(json.dumps(rec, sort_keys=False) + "\n")
