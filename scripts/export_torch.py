#!/usr/bin/python3
"""Loads a ddpvision checkpoint into the equivalent PyTorch module and evaluates it on a store.

Proof that our names and layouts are PyTorch's: the checkpoint's /params and /buffers are loaded
with a strict load_state_dict into the twin module of scripts/ddpv_torch.py, and the module is
evaluated (eval mode: BatchNorm uses the running statistics) on one split of an HDF5 image store.

    export_torch.py --checkpoint run/ckpt-e0005-s00002345.h5 --data fashion.h5 --split test
    export_torch.py --checkpoint run/ckpt.h5 --save model.pt          # no evaluation

The last line printed is machine-readable:
    accuracy=<float> loss=<float> samples=<int>
(loss is the mean cross-entropy over the split). Exit codes: 0 ok, 1 error (one line on stderr),
2 usage, 77 when torch or h5py cannot be imported (a test suite's "skipped").
"""
import argparse
import os
import sys

PROG = "export_torch.py"


class UserError(Exception):
    """A problem with the inputs: reported as one line, exit code 1."""


def import_or_skip():
    try:
        import h5py  # noqa: F401
        import numpy  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        print(f"{PROG}: skipped: {e.name or e} is not importable by {sys.executable} "
              "(install Debian's python3-torch and python3-h5py)", file=sys.stderr)
        sys.exit(77)


def read_str(attrs, name, where):
    if name not in attrs:
        raise UserError(f"{where}: attribute '{name}' is missing")
    v = attrs[name]
    return v.decode() if isinstance(v, bytes) else str(v)


def read_int(attrs, name, where):
    if name not in attrs:
        raise UserError(f"{where}: attribute '{name}' is missing")
    return int(attrs[name])


def open_ddpv_file(h5py, path, what, fmt, hint):
    """Opens a ddpvision HDF5 file read-only after checking that it exists, is HDF5 and carries
    the root attribute format = `fmt`; `what` names it in errors ("checkpoint", "store")."""
    if not os.path.isfile(path):
        raise UserError(f"{what} {path} does not exist")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise UserError(f"{what} {path} cannot be read as HDF5 (truncated or corrupt?): {e}")
    if f.attrs.get("format", b"") not in (fmt.encode(), fmt):
        f.close()
        article = "an" if what[0] in "aeiou" else "a"
        raise UserError(f"{path} is not {article} ddpvision {what.replace('store', 'image store')} "
                        f"({hint})")
    return f


def load_checkpoint(path):
    """Returns (torch module with the checkpoint's state, metadata dict)."""
    import h5py
    import numpy as np
    import torch

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ddpv_torch import make_model

    with open_ddpv_file(h5py, path, "checkpoint", "ddpvision-checkpoint",
                        "no format attribute 'ddpvision-checkpoint'") as f:
        meta = {k: read_int(f.attrs, k, path)
                for k in ("format_version", "height", "width", "channels", "num_classes",
                          "epoch", "step")}
        meta["model"] = read_str(f.attrs, "model", path)
        # Version 2 adds a checksummed header in the HDF5 user block, which h5py skips, and
        # attributes this script does not need: the datasets read the same.
        if meta["format_version"] not in (1, 2):
            raise UserError(f"{path}: format_version {meta['format_version']} is not supported "
                            "by this script (it reads 1 and 2)")
        hwc = (meta["height"], meta["width"], meta["channels"])
        try:
            model = make_model(meta["model"], hwc, meta["num_classes"])
        except ValueError as e:
            raise UserError(f"{path}: {e}")
        state = {}
        for group in ("params", "buffers"):
            if group not in f:
                raise UserError(f"{path}: group /{group} is missing")
            for name, ds in f[group].items():
                if name.endswith(".num_batches_tracked"):
                    state[name] = torch.tensor(int(ds[()]), dtype=torch.int64)
                else:
                    state[name] = torch.from_numpy(np.asarray(ds[()], dtype=np.float32))
    try:
        model.load_state_dict(state, strict=True)  # names, and shapes, must all match
    except RuntimeError as e:
        raise UserError(f"{path}: does not match torch's {meta['model']}: "
                        + " ".join(str(e).split()))
    meta["tensors"] = len(state)
    return model, meta


def evaluate(model, meta, data, split, batch_size):
    """Mean cross-entropy and top-1 accuracy of `model` over one split of an image store."""
    import h5py
    import numpy as np
    import torch
    import torch.nn.functional as F

    with open_ddpv_file(h5py, data, "store", "ddpvision-image-store",
                        "see docs/data-format.md") as f:
        if split not in f or "images" not in f[split] or "labels" not in f[split]:
            have = ", ".join(k for k in f.keys()) or "none"
            raise UserError(f"{data} has no split '{split}' (splits: {have}); pass --split")
        images, labels = f[split]["images"], f[split]["labels"]
        n, h, w, c = images.shape
        want = (meta["height"], meta["width"], meta["channels"])
        if (h, w, c) != want:
            raise UserError(f"{data}: images are {(h, w, c)} (H, W, C) but the checkpoint's model "
                            f"takes {want}")
        if labels.shape != (n,):
            raise UserError(f"{data}: /{split}/labels has shape {labels.shape}, expected ({n},)")
        mean = np.asarray(f.attrs["mean"], dtype=np.float32).reshape(c)
        inv_std = np.float32(1.0) / np.asarray(f.attrs["std"], dtype=np.float32).reshape(c)
        # The same float32 arithmetic as the C++ loader: (v / 255 - mean) * (1 / std), tabulated.
        table = (np.arange(256, dtype=np.float32)[:, None] / np.float32(255.0) - mean) * inv_std
        model.eval()
        loss_sum, correct = 0.0, 0
        with torch.no_grad():
            for start in range(0, n, batch_size):
                x8 = images[start:start + batch_size]                    # (B, H, W, C) uint8
                y = torch.from_numpy(np.asarray(labels[start:start + batch_size], dtype=np.int64))
                if y.numel() and (int(y.min()) < 0 or int(y.max()) >= meta["num_classes"]):
                    raise UserError(f"{data}: /{split}/labels holds values outside "
                                    f"[0, {meta['num_classes']})")
                x = table[x8, np.arange(c)]                              # (B, H, W, C) float32
                x = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))  # NCHW
                logits = model(x)
                loss_sum += float(F.cross_entropy(logits.double(), y, reduction="sum"))
                correct += int((logits.argmax(dim=1) == y).sum())
    if n == 0:
        raise UserError(f"{data}: split '{split}' is empty")
    return correct / n, loss_sum / n, n


def main(argv):
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", required=True, help="a ddpvision checkpoint (.h5)")
    ap.add_argument("--data", help="an HDF5 image store to evaluate on")
    ap.add_argument("--split", default="test", help="split of the store (default: test)")
    ap.add_argument("--batch-size", type=int, default=256, help="evaluation batch (default 256)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--save", metavar="MODEL.pt", help="write the state_dict with torch.save")
    args = ap.parse_args(argv)
    if args.batch_size <= 0:
        ap.error("--batch-size must be positive")
    if args.data is None and args.save is None:
        ap.error("nothing to do: pass --data (evaluate) and/or --save (export)")

    import_or_skip()
    import torch
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        model, meta = load_checkpoint(args.checkpoint)
        print(f"{args.checkpoint}: {meta['model']} ({meta['height']}x{meta['width']}x"
              f"{meta['channels']}, {meta['num_classes']} classes), epoch {meta['epoch']}, "
              f"step {meta['step']}: {meta['tensors']} tensors loaded into torch (strict)")
        if args.save:
            try:
                torch.save(model.state_dict(), args.save)
            except (OSError, RuntimeError) as e:
                raise UserError(f"cannot write {args.save}: {e}")
            print(f"saved the torch state_dict to {args.save}")
        if args.data:
            acc, loss, n = evaluate(model, meta, args.data, args.split, args.batch_size)
            print(f"accuracy={acc:.6f} loss={loss:.6f} samples={n}")
    except UserError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # an unforeseen malformed input: still one line, not a traceback
        print(f"{PROG}: error: {type(e).__name__}: " + " ".join(str(e).split()), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
