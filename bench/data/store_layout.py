#!/usr/bin/python3
"""Two HDF5 layouts for variable-size JPEG byte strings, measured with h5py in one process:

    bench/data/store_layout.py [--images 2000] [--reads 50] [--batch 256] [--folder DIR]
        [--chunk-kib 256] [--seed 0]

  flat  one chunked 1-D uint8 dataset of every image's bytes end to end, and an int64 offsets
        dataset [N + 1]; a batch reads the sorted indices' byte ranges, consecutive indices
        merged into one slice
  vlen  one variable-length uint8 dataset (h5py.vlen_dtype(np.uint8)), one element per image;
        a batch is one fancy index of the sorted indices

The images are the first --images JPEGs under --folder (recursively, sorted), or textured
ones made as bench/data/make_jpeg_folder.py makes them. Both layouts read the same random
batches, alternating which goes first, after one untimed pass over every byte so the page
cache is warm for both. Prints a line for people, then a JSON line (last on stdout) with each
layout's write seconds, file size and median milliseconds per batch. The files go in a
temporary folder that is removed at the end.
"""
import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_jpeg_folder  # noqa: E402


def load_images(a):
    if a.folder:
        paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(a.folder) for f in fs
                       if f.lower().endswith((".jpeg", ".jpg")))[:a.images]
        if not paths:
            raise SystemExit(f"store_layout.py: no JPEG files under {a.folder}")
        return [np.fromfile(p, dtype=np.uint8) for p in paths]
    out = []
    for i in range(a.images):
        buf = io.BytesIO()
        rng = np.random.default_rng([a.seed, 2, i])
        make_jpeg_folder.save_jpeg(make_jpeg_folder.textured_image(rng, None, a.seed), buf)
        out.append(np.frombuffer(buf.getvalue(), dtype=np.uint8))
    return out


def write_flat(path, images, chunk):
    offsets = np.zeros(len(images) + 1, np.int64)
    np.cumsum([len(b) for b in images], out=offsets[1:])
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.concatenate(images), chunks=(chunk,))
        f.create_dataset("offsets", data=offsets)


def write_vlen(path, images):
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("data", (len(images),), dtype=h5py.vlen_dtype(np.uint8))
        ds[:] = images


def read_flat(data, offsets, idx):
    """Each image's bytes of the sorted indices idx: one slice per run of consecutive ones."""
    out, i = [], 0
    while i < len(idx):
        j = i + 1
        while j < len(idx) and idx[j] == idx[j - 1] + 1:
            j += 1
        lo, hi = offsets[idx[i]], offsets[idx[j - 1] + 1]
        run = data[lo:hi]
        for k in idx[i:j]:
            out.append(run[offsets[k] - lo:offsets[k + 1] - lo])
        i = j
    return out


def read_vlen(data, idx):
    return list(data[idx])


def main(argv):
    p = argparse.ArgumentParser(prog="store_layout.py", description=__doc__.split("\n")[0])
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--reads", type=int, default=50, help="timed batches per layout")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--folder", default="", help="read JPEGs from here instead of making them")
    p.add_argument("--chunk-kib", type=int, default=256,
                   help="chunk of the flat layout (the converter's default is about 256 KiB)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.images < 1 or a.reads < 1 or a.batch < 1 or a.chunk_kib < 1:
        p.error("--images, --reads, --batch and --chunk-kib must be positive")

    images = load_images(a)
    n = len(images)
    batch = min(a.batch, n)
    total = sum(len(b) for b in images)
    rng = np.random.default_rng([a.seed, 3])
    batches = [np.sort(rng.choice(n, batch, replace=False)) for _ in range(a.reads)]
    res = {}
    with tempfile.TemporaryDirectory(prefix="store_layout.") as tmp:
        paths = {"flat": os.path.join(tmp, "flat.h5"), "vlen": os.path.join(tmp, "vlen.h5")}
        for name in ("flat", "vlen"):
            t0 = time.perf_counter()
            if name == "flat":
                write_flat(paths[name], images, a.chunk_kib * 1024)
            else:
                write_vlen(paths[name], images)
            res[name] = {"write_s": round(time.perf_counter() - t0, 3),
                         "file_mib": round(os.path.getsize(paths[name]) / 2**20, 2)}
        with h5py.File(paths["flat"], "r") as ff, h5py.File(paths["vlen"], "r") as fv:
            flat, offsets, vlen = ff["data"], ff["offsets"][:], fv["data"]
            # The untimed pass: warms the page cache, and checks both give back every byte.
            everything = np.arange(n)
            for got in (read_flat(flat, offsets, everything), read_vlen(vlen, everything)):
                if len(got) != n or any(not np.array_equal(g, b) for g, b in zip(got, images)):
                    raise SystemExit("store_layout.py: a layout read back other bytes")
            times = {"flat": [], "vlen": []}
            for r, idx in enumerate(batches):
                order = ("flat", "vlen") if r % 2 == 0 else ("vlen", "flat")
                for name in order:
                    t0 = time.perf_counter()
                    got = read_flat(flat, offsets, idx) if name == "flat" else read_vlen(vlen, idx)
                    times[name].append(time.perf_counter() - t0)
                    assert len(got) == batch
    for name in res:
        res[name]["batch_ms"] = round(1e3 * statistics.median(times[name]), 3)
    ratio = res["vlen"]["batch_ms"] / res["flat"]["batch_ms"]
    print(f"store_layout: {n} JPEGs of {total / n / 1024:.0f} KiB on average, {a.reads} random "
          f"batches of {batch}, page cache warm: flat bytes + offsets "
          f"{res['flat']['batch_ms']:.2f} ms a batch (written in {res['flat']['write_s']:.2f} s, "
          f"{res['flat']['file_mib']:.1f} MiB), vlen {res['vlen']['batch_ms']:.2f} ms "
          f"({res['vlen']['write_s']:.2f} s, {res['vlen']['file_mib']:.1f} MiB): "
          f"vlen / flat {ratio:.2f}x")
    print(json.dumps({"bench": "store_layout", "images": n, "mean_bytes": round(total / n),
                      "batch": batch, "reads": a.reads, "chunk_kib": a.chunk_kib,
                      "h5py": h5py.version.version, "hdf5": h5py.version.hdf5_version,
                      "flat": res["flat"], "vlen": res["vlen"],
                      "vlen_over_flat": round(ratio, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
