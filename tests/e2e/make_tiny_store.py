#!/usr/bin/python3
"""Writes raw IDX files of a tiny, learnable 10-class problem (each class a bright bar at its own
position plus noise), for the end-to-end tests: ddpv-convert turns them into a store.

    make_tiny_store.py OUTDIR [--train N] [--test N] [--size S]
Only the Python standard library is used.
"""
import argparse
import os
import random
import struct


def write_idx(path, magic_type, dims, payload):
    with open(path, "wb") as f:
        f.write(struct.pack(">HBB", 0, magic_type, len(dims)))
        for d in dims:
            f.write(struct.pack(">I", d))
        f.write(payload)


def make(n, size, rng):
    images = bytearray()
    labels = bytearray()
    for _ in range(n):
        label = rng.randrange(10)
        img = [rng.randrange(0, 60) for _ in range(size * size)]
        row = 1 + label * (size - 2) // 10  # a horizontal bar whose height encodes the class
        for x in range(size):
            for r in (row, row + 1):
                img[r * size + x] = 200 + rng.randrange(56)
        images.extend(img)
        labels.append(label)
    return bytes(images), bytes(labels)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--train", type=int, default=512)
    ap.add_argument("--test", type=int, default=200)
    ap.add_argument("--size", type=int, default=28)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    os.makedirs(a.outdir, exist_ok=True)
    for split, n in (("train", a.train), ("test", a.test)):
        images, labels = make(n, a.size, rng)
        write_idx(os.path.join(a.outdir, f"{split}-images"), 0x08, [n, a.size, a.size], images)
        write_idx(os.path.join(a.outdir, f"{split}-labels"), 0x08, [n], labels)


if __name__ == "__main__":
    main()
