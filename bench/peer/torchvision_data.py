#!/usr/bin/python3
"""The peer of bench/data_bench.cpp in `make bench-data`: torchvision's ImageNet input pipeline
(ImageFolder + DataLoader, the transforms of the PyTorch ImageNet example) over a JPEG folder.

    bench/peer/torchvision_data.py --root DIR --split train|val --workers N [--batch 64]
        [--crop 224] [--batches K] [--warmup 2]

train: RandomResizedCrop(crop) (scale 0.08-1, ratio 3/4-4/3, bilinear), RandomHorizontalFlip,
ToTensor, Normalize; val: Resize(int(crop / 0.875)), CenterCrop(crop), ToTensor, Normalize.
Prints one JSON line, last on stdout:
    {"peer": "torchvision", "torchvision": ..., "split": ..., "workers": N, "batch": B,
     "crop": C, "images": n, "seconds": s, "images_per_s": x}

Note [Peer data fairness]: N worker processes of one torch thread each decode and transform
(the main process only collects batches), against our N decode threads: one core per worker
or thread on both sides. The first W batches (worker start-up, first file reads) are not
timed; the page cache is warm for both sides, since the driver reads the folder and the store
before any timed run. The loader is cycled (persistent workers, a new epoch) when K + W
exceeds an epoch, as data_bench cycles its split. DataLoader keeps up to prefetch_factor (2)
batches per worker in flight, so the timed stretch starts with some already under way; K is
chosen many times that so the head start is a few percent at most.
"""
import argparse
import json
import os
import sys
import time


def _one_thread(_worker_id):
    import torch
    torch.set_num_threads(1)


def main(argv):
    p = argparse.ArgumentParser(prog="torchvision_data.py", description=__doc__.split("\n")[0])
    p.add_argument("--root", required=True, help="folder with train/ and val/ class trees")
    p.add_argument("--split", choices=("train", "val"), required=True)
    p.add_argument("--workers", type=int, required=True, help="DataLoader worker processes")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--batches", type=int, default=40, help="timed batches")
    p.add_argument("--warmup", type=int, default=2, help="untimed batches first")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.workers < 1 or a.batch < 1 or a.crop < 1 or a.batches < 1 or a.warmup < 0:
        p.error("--workers, --batch, --crop and --batches must be positive, --warmup >= 0")

    import torch
    import torchvision
    from torchvision import datasets, transforms

    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    if a.split == "train":
        tf = transforms.Compose([transforms.RandomResizedCrop(a.crop),
                                 transforms.RandomHorizontalFlip(),
                                 transforms.ToTensor(), normalize])
    else:
        tf = transforms.Compose([transforms.Resize(int(a.crop / 0.875)),
                                 transforms.CenterCrop(a.crop),
                                 transforms.ToTensor(), normalize])
    folder = os.path.join(a.root, a.split)
    try:
        ds = datasets.ImageFolder(folder, transform=tf)
    except (FileNotFoundError, RuntimeError) as e:
        print(f"torchvision_data.py: {folder}: {e}", file=sys.stderr)
        return 1
    loader = torch.utils.data.DataLoader(
        ds, batch_size=a.batch, shuffle=a.split == "train", num_workers=a.workers,
        persistent_workers=True, prefetch_factor=2, worker_init_fn=_one_thread)

    def batches():
        while True:  # a new epoch whenever one ends
            yield from loader

    it = batches()
    for _ in range(a.warmup):
        next(it)
    images = 0
    t0 = time.perf_counter()
    for _ in range(a.batches):
        x, _labels = next(it)
        images += x.shape[0]
    seconds = time.perf_counter() - t0
    print(json.dumps({"peer": "torchvision", "torchvision": torchvision.__version__,
                      "split": a.split, "workers": a.workers, "batch": a.batch, "crop": a.crop,
                      "images": images, "seconds": round(seconds, 4),
                      "images_per_s": round(images / seconds, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
