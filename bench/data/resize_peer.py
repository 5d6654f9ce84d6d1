#!/usr/bin/env python3
"""OpenCV's resize of random RGB images to 224x224, one thread: the peer of `data_bench --resize`.

INTER_AREA is OpenCV's antialiased downscale (what our triangle filter and PIL's antialiased
bilinear do when shrinking); INTER_LINEAR samples 2x2 pixels whatever the scale (no antialias:
the same as ours when enlarging, aliased when shrinking). Prints a human line per case, then one
JSON line.
"""
import json
import time

import cv2
import numpy as np


def main():
    cv2.setNumThreads(1)
    rng = np.random.default_rng(0)
    out = {"bench": "resize_peer", "opencv": cv2.__version__}
    for sh, sw in ((328, 328), (300, 400), (160, 200)):
        src = rng.integers(0, 256, (sh, sw, 3), dtype=np.uint8)
        for name, interp in (("area", cv2.INTER_AREA), ("linear", cv2.INTER_LINEAR)):
            for _ in range(20):
                cv2.resize(src, (224, 224), interpolation=interp)
            n = 2000
            t = time.perf_counter()
            for _ in range(n):
                cv2.resize(src, (224, 224), interpolation=interp)
            us = (time.perf_counter() - t) / n * 1e6
            print(f"{sh}x{sw} -> 224 OpenCV {cv2.__version__} INTER_{name.upper()}: {us:.0f} us")
            out[f"{sh}x{sw}_{name}_us"] = round(us, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
