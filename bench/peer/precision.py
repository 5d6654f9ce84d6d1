"""The precision rows of `make bench` (scripts/bench.sh, "precision"): ours and PyTorch's
synthetic training throughput in fp32 and bf16 side by side, read from the raw files

    prec-ours-{model}-w{ranks}-{fp32,bf16}.{jsonl,rc,log,verbose}   ddpv-train
    prec-{torch113,torchcur}-{model}-w{ranks}-{prec}[-compile].{json,rc,log}
                                                                      bench/peer/torch_ddp.py
    prec-bf16-runs                                                    0: bf16 was not run

and put into one Markdown section: images/s per cell (or why there is none: refused, failed,
not run), the ratios the bf16 targets are judged on, and which convolution implementations
oneDNN chose (their names carry the ISA).
"""
import json
import os

from onednn_verbose import best_isa, conv_implementations, native_bf16
from raw_results import ours_images_per_s

CASES = [("lenet", 1), ("lenet", 2), ("resnet20", 1), ("resnet20", 2), ("resnet50", 1)]
PEERS = [("torch113", ""), ("torchcur", ""), ("torchcur", "-compile")]
TARGET_VS_PEER = 1.3      # ours bf16 against the faster PyTorch bf16
TARGET_VS_FP32_AMX = {"resnet20": 2.0, "resnet50": 4.0}  # ours bf16 against ours fp32, on AMX


def _last_line(path):
    try:
        with open(path, errors="replace") as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _rc(base):
    try:
        with open(base + ".rc") as f:
            return int(f.read().strip() or "1")
    except (OSError, ValueError):
        return None  # not run


def read_cell(raw, side, model, ranks, prec, suffix=""):
    """{"rate": images/s or None, "why": text when None, "impls": [...], "torch": version}."""
    base = os.path.join(raw, f"prec-{side}-{model}-w{ranks}-{prec}{suffix}")
    rc = _rc(base)
    if rc is None:
        return {"rate": None, "why": "not run", "impls": []}
    if rc != 0:
        why = "refused" if rc == 2 else ("timed out" if rc == 124 else f"failed (exit {rc})")
        return {"rate": None, "why": why, "detail": _last_line(base + ".log"), "impls": []}
    try:
        if side == "ours":
            cell = {"rate": ours_images_per_s(base + ".jsonl"), "impls": []}
            if os.path.exists(base + ".verbose"):
                with open(base + ".verbose", errors="replace") as f:
                    cell["impls"] = conv_implementations(f.read())
            return cell
        with open(base + ".json") as f:
            out = json.load(f)
    except (OSError, ValueError, KeyError) as e:
        return {"rate": None, "why": "no result", "detail": str(e), "impls": []}
    best = out["best_format"]
    return {"rate": out["images_per_s"], "impls": out["formats"][best].get("conv_impls", []),
            "torch": out.get("torch", "?"), "format": best}


def collect(raw):
    """{(model, ranks): {(side, prec): cell}} for every case that has at least one file."""
    table = {}
    for model, ranks in CASES:
        cells = {}
        for prec in ("fp32", "bf16"):
            cells[("ours", prec)] = read_cell(raw, "ours", model, ranks, prec)
            for side, suffix in PEERS:
                cells[(side + suffix, prec)] = read_cell(raw, side, model, ranks, prec, suffix)
        if any(c["why"] != "not run" for c in cells.values() if c["rate"] is None) or \
                any(c["rate"] for c in cells.values()):
            table[(model, ranks)] = cells
    return table


def _fmt(cell):
    r = cell["rate"]
    return (f"{r:.0f}" if r >= 100 else f"{r:.3g}") if r else cell["why"]


def _ratio(a, b):
    return a / b if a and b else None


def markdown(raw, cpuinfo="/proc/cpuinfo"):
    """The section, or "" when the run made no precision rows."""
    table = collect(raw)
    if not table:
        return ""
    native = native_bf16(cpuinfo)
    try:
        with open(os.path.join(raw, "prec-bf16-runs")) as f:
            bf16_ran = f.read().strip() != "0"
    except OSError:
        bf16_ran = True
    versions = sorted({c["torch"] for cells in table.values() for c in cells.values()
                       if c.get("torch")})
    out = ["### Precision: fp32 and bf16 side by side", ""]
    out.append("images/s, synthetic data, 1 thread per rank, batch 64 per rank (resnet50: "
               "224x224, batch 16); PyTorch with CPU autocast to bf16, its faster memory format "
               f"(resnet50: channels_last); PyTorch versions: {', '.join(versions) or 'none'}. "
               "One round.")
    if native:
        out.append(f"This CPU has native bf16 ({native}).")
    elif bf16_ran:
        out.append("This CPU has no native bf16 (no AMX-BF16 or AVX512-BF16): oneDNN emulates "
                   "bf16 on AVX-512, so the bf16 figures are not those of bf16 hardware and no "
                   "bf16 ratio is judged.")
    else:
        out.append("**This CPU has no native bf16 and no AVX-512** (oneDNN has no bf16 "
                   "convolution here and PyTorch's fallback runs about 20x slower than its "
                   "fp32): no bf16 run was made, and no bf16 ratio is given.")
    out.append("")
    cols = ["model, ranks", "ours fp32", "ours bf16", "torch 1.13 fp32", "torch 1.13 bf16",
            "torch now fp32", "torch now bf16", "compiled fp32", "compiled bf16",
            "ours bf16 / best torch bf16", "ours bf16 / ours fp32", "ours fp32 / best torch fp32"]
    out.append("| " + " | ".join(cols) + " |")
    out.append("|" + "---|" * len(cols))
    reasons = {}
    for (model, ranks), c in table.items():
        def best(prec):
            rates = [c[(s + x, prec)]["rate"] for s, x in PEERS if c[(s + x, prec)]["rate"]]
            return max(rates) if rates else None
        row = [f"{model} x{ranks}"]
        for key in [("ours", "fp32"), ("ours", "bf16"), ("torch113", "fp32"),
                    ("torch113", "bf16"), ("torchcur", "fp32"), ("torchcur", "bf16"),
                    ("torchcur-compile", "fp32"), ("torchcur-compile", "bf16")]:
            row.append(_fmt(c[key]))
            if c[key].get("detail"):
                reasons.setdefault(c[key]["detail"][:200], []).append(
                    f"{key[0]} {key[1]} {model} x{ranks}")
        if native:
            r = _ratio(c[("ours", "bf16")]["rate"], best("bf16"))
            row.append(f"{r:.2f}x (target {TARGET_VS_PEER}x: {'met' if r >= TARGET_VS_PEER else 'missed'})"
                       if r else "n/a")
            r = _ratio(c[("ours", "bf16")]["rate"], c[("ours", "fp32")]["rate"])
            goal = TARGET_VS_FP32_AMX.get(model) if native == "amx_bf16" and ranks == 1 else None
            row.append((f"{r:.2f}x" + (f" (target {goal}x: {'met' if r >= goal else 'missed'})"
                                       if goal else "")) if r else "n/a")
        else:
            row += ["no native bf16", "no native bf16"]
        r = _ratio(c[("ours", "fp32")]["rate"], best("fp32"))
        row.append(f"{r:.2f}x" if r else "n/a")
        out.append("| " + " | ".join(row) + " |")
    out.append("")
    out.append("oneDNN's convolution implementations (the widest ISA seen per side and "
               "precision, over the models):")
    out.append("")
    for side, label in [("ours", "ours"), ("torch113", "torch 1.13"), ("torchcur", "torch now"),
                        ("torchcur-compile", "torch now, compiled")]:
        for prec in ("fp32", "bf16"):
            impls = sorted({i for cells in table.values() for i in cells[(side, prec)]["impls"]})
            if impls:
                out.append(f"- {label} {prec}: {best_isa(impls)} ({'; '.join(impls)})")
    if reasons:
        out.append("")
        out.append("Runs without a figure, and why:")
        out.append("")
        for why, where in reasons.items():
            out.append(f"- {', '.join(where)}: `{why}`")
    return "\n".join(out) + "\n"
