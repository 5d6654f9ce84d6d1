#!/usr/bin/python3
"""Writes an ImageNet-like folder of synthetic JPEGs for `make bench-data`:

    bench/data/make_jpeg_folder.py OUT_DIR [--train 2000] [--val 500] [--classes 10] [--seed 0]

OUT_DIR/train/<class>/<i>.JPEG and OUT_DIR/val/<class>/<i>.JPEG, image i of a split in class
i % classes. What the decoder sees is what matters to the benchmark, so the images are shaped
like ImageNet's: sizes around 500x375 (a fifth portrait), baseline JPEG at quality 90 with
4:2:0 chroma, and texture at many frequencies (oriented sinusoids, gradients, filled shapes,
noise), since a flat image would decode and compress far faster than a photograph.

Every image comes from its own generator seeded by (seed, split, i), so a seed gives the same
tree whatever order it is written in (on another BLAS a pixel may differ by one level). The
last thing written is OUT_DIR/.complete, the arguments as JSON: a run whose arguments and file
counts match it returns at once, and any other run rewrites train/ and val/.
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np
from PIL import Image, ImageDraw

SPLITS = ("train", "val")
MARKER = ".complete"


def class_name(k):
    return f"n{k:08d}"  # ImageNet's wnid shape, so the folder sorts and reads the same way


_NOISE = {}


def _noise_pool(seed):
    """Gaussian noise (sigma 8 of 255) to crop each image's from: drawing it per image would
    cost more than the rest of the image together."""
    if seed not in _NOISE:
        rng = np.random.default_rng([seed, 7])
        _NOISE[seed] = rng.standard_normal((3, 700, 700), dtype=np.float32) * np.float32(8.0)
    return _NOISE[seed]


def textured_image(rng, hue=None, noise_seed=0):
    """One RGB PIL image of ImageNet-like size with texture at several scales. hue (0-1)
    tints the class's images alike; None picks one at random."""
    w, h = int(rng.integers(400, 601)), int(rng.integers(300, 451))
    if rng.random() < 0.2:
        w, h = h, w
    side = max(w, h)
    px, py = np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32)

    # A smooth colour gradient between two colours near the class's hue.
    hue = rng.random() if hue is None else hue
    base = 0.5 + 0.3 * np.cos(2 * np.pi * (hue + np.array([0.0, 1 / 3, 2 / 3])))
    c0 = np.clip(base + rng.normal(0, 0.15, 3), 0.1, 0.9)
    d = np.clip(base + rng.normal(0, 0.25, 3), 0.1, 0.9) - c0
    gx, gy = rng.normal(0, 1, 2)
    lo, hi = min(gx, 0) + min(gy, 0), max(gx, 0) + max(gy, 0)
    ramp = (np.float32(gy / h) * py[:, None] + np.float32(gx / w) * px[None, :]
            - np.float32(lo)) / np.float32(max(hi - lo, 1e-6))
    # Channel planes (3, h, w) until the end: numpy is several times slower on a last axis of 3.
    img = np.empty((3, h, w), np.float32)
    for c in range(3):
        np.multiply(ramp, np.float32(d[c] * 255.0), out=img[c])
        img[c] += np.float32(c0[c] * 255.0)

    # Oriented sinusoids from a couple of cycles per image down to a 5-pixel period, amplitude
    # falling with frequency as in photographs: 7 in a luminance plane, 3 in a colour one,
    # each plane a sum of separable terms, cos(ax + by + p) = cos(by + p) cos(ax) -
    # sin(by + p) sin(ax), so one small matrix product (cheap even on the reference BLAS).
    for n_waves in (7, 3):
        cols, rows = [], []
        for _ in range(n_waves):
            f = float(np.exp(rng.uniform(np.log(1.5), np.log(side / 5.0))))  # cycles per side
            theta, phase = rng.uniform(0, np.pi), rng.uniform(0, 2 * np.pi)
            k = 2 * np.pi * f / side
            a, b = k * np.cos(theta), k * np.sin(theta)
            amp = 255.0 * rng.uniform(0.05, 0.12) * (2.0 / f) ** 0.25
            cols += [np.cos(b * py + phase), np.sin(b * py + phase)]
            rows += [amp * np.cos(a * px), -amp * np.sin(a * px)]
        plane = np.stack(cols, axis=1).astype(np.float32) @ np.stack(rows).astype(np.float32)
        tint = (1.0 + rng.normal(0, 0.3, 3)) if n_waves == 7 else rng.normal(0, 0.6, 3)
        for c in range(3):
            img[c] += np.float32(tint[c]) * plane

    # A few filled ellipses with stripes of their own.
    for _ in range(int(rng.integers(1, 4))):
        ex, ey = rng.uniform(0.1, 0.9) * w, rng.uniform(0.1, 0.9) * h
        rx, ry = rng.uniform(0.05, 0.3) * w, rng.uniform(0.05, 0.3) * h
        x0, x1 = max(int(ex - rx), 0), min(int(ex + rx) + 1, w)
        y0, y1 = max(int(ey - ry), 0), min(int(ey + ry) + 1, h)
        if x0 >= x1 or y0 >= y1:
            continue
        dx, dy = (px[x0:x1] - ex) / rx, (py[y0:y1] - ey) / ry
        inside = (dy[:, None] ** 2 + dx[None, :] ** 2) < 1.0
        col = rng.uniform(0, 255, 3)
        stripes = 25.0 * np.sin(rng.uniform(10, 60) * (dx[None, :] + 0.5 * dy[:, None]))
        for c in range(3):
            img[c, y0:y1, x0:x1][inside] = (col[c] + stripes)[inside]

    # Mild sensor-like noise, then 8 bits.
    pool = _noise_pool(noise_seed)
    oy = int(rng.integers(0, pool.shape[1] - h + 1))
    ox = int(rng.integers(0, pool.shape[2] - w + 1))
    img += pool[:, oy:oy + h, ox:ox + w]
    np.clip(img, 0, 255, out=img)
    planes = img.astype(np.uint8)
    im = Image.merge("RGB", [Image.fromarray(planes[c], "L") for c in range(3)])

    # A few flat polygons: the hard edges that real scenes have and sinusoids lack.
    draw = ImageDraw.Draw(im)
    for _ in range(int(rng.integers(1, 4))):
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(20, 120)
        n = int(rng.integers(3, 7))
        ang = np.sort(rng.uniform(0, 2 * np.pi, n))
        pts = [(float(cx + r * np.cos(t)), float(cy + r * np.sin(t))) for t in ang]
        draw.polygon(pts, fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    return im


def save_jpeg(im, path):
    # Baseline (not progressive), 4:2:0: how most of ImageNet is encoded.
    im.save(path, "JPEG", quality=90, subsampling="4:2:0", optimize=False, progressive=False)


def count_files(out):
    return {s: sum(len(fs) for _, _, fs in os.walk(os.path.join(out, s))) for s in SPLITS}


def main(argv):
    p = argparse.ArgumentParser(prog="make_jpeg_folder.py", description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--train", type=int, default=2000, help="train images")
    p.add_argument("--val", type=int, default=500, help="val images")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.train < 0 or a.val < 0 or a.classes < 1 or a.seed < 0:
        p.error("--train and --val must be >= 0, --classes >= 1, --seed >= 0")
    args = {"train": a.train, "val": a.val, "classes": a.classes, "seed": a.seed}
    marker = os.path.join(a.out, MARKER)
    try:
        with open(marker) as f:
            if json.load(f) == args and count_files(a.out) == {"train": a.train, "val": a.val}:
                print(f"make_jpeg_folder.py: {a.out} is complete ({a.train} train, {a.val} val)")
                return 0
    except (OSError, ValueError):
        pass
    if os.path.exists(marker):
        os.remove(marker)
    os.makedirs(a.out, exist_ok=True)
    hues = np.random.default_rng([a.seed, 99]).random(a.classes)
    total = 0
    for s_idx, split in enumerate(SPLITS):
        root = os.path.join(a.out, split)
        shutil.rmtree(root, ignore_errors=True)
        for k in range(a.classes):
            os.makedirs(os.path.join(root, class_name(k)))
        for i in range(args[split]):
            k = i % a.classes
            rng = np.random.default_rng([a.seed, s_idx, i])
            path = os.path.join(root, class_name(k), f"{i}.JPEG")
            save_jpeg(textured_image(rng, hues[k], a.seed), path)
            total += os.path.getsize(path)
    with open(marker, "w") as f:
        json.dump(args, f)
        f.write("\n")
    n = a.train + a.val
    print(f"make_jpeg_folder.py: wrote {a.train} train and {a.val} val images in {a.classes} "
          f"classes to {a.out} ({total / max(n, 1) / 1024:.0f} KiB per image)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
