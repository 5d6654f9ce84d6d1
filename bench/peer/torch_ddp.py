#!/usr/bin/python3
"""The PyTorch DistributedDataParallel peer of `make bench`: the same models, batch, optimizer,
threads and world size as ddpv-train, so scripts/bench.sh can put the two side by side.

Synthetic throughput (NCHW and channels_last, both reported, the faster named "best"):
    torch_ddp.py --model resnet20 --world-size 2 --threads 1 --batch-size 64 \\
                 --warmup 3 --steps 12 --json out.json
Mixed precision as AMP does it on CPU (torch.autocast("cpu", torch.bfloat16) around forward
and loss; fp32 weights, gradients and optimizer), and optionally through torch.compile:
    torch_ddp.py --model resnet50 --precision bf16 [--compile] --batch-size 16 ...
Time to a test accuracy on the real Fashion-MNIST store made by ddpv-convert (lenet):
    torch_ddp.py --fashion-mnist store.h5 --world-size 2 --epochs 6 --lr 0.05 \\
                 --target 0.91 --json out.json

Note [Peer fairness]: everything that ddpv-train does the same way is done the same way here:
per-rank batch, global-batch learning rate (DDP averages gradients, as our reducer does),
SGD with momentum and weight decay on conv/linear weights only (biases and BatchNorm are not
decayed, as in our decay spans), the cosine schedule by step, ours' initialisation (PyTorch's
default uniform(1/sqrt(fan_in)) for lenet, kaiming-normal fan-out for ResNet convolutions),
synthetic data made once (two fixed batches per rank served round robin), a shuffled
DistributedSampler without drop_last for the real data, normalisation with the store's mean
and std, no augmentation. PyTorch gets its best case where it has a choice: data already
normalised in memory (no DataLoader workers competing for the two cores), no per-step
loss readback, no per-step BatchNorm buffer broadcast (ours has none either), plain
single-process training at world size 1 (DDP at world size 1 would only add bucket copies),
OpenBLAS for the linear layers (scripts/bench.sh), the faster of NCHW and channels_last, and
an allocator that keeps freed memory (Note [Peer allocator]).

Ranks are processes made by torch.multiprocessing.spawn, rendezvous through a file://
store in a temporary directory, gloo over the loopback interface; nothing leaves the host.
Output: one JSON object (stdout and --json), only from rank 0.
"""
import argparse
import ctypes.util
import json
import math
import os
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))

# One thread per rank is the comparison; OpenMP and OpenBLAS read these before their pools start.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

# Note [Peer allocator]: PyTorch's CPU tensors come from malloc and go back to it every step.
# glibc serves the large ones (lenet's activations at batch 64: up to 6.4 MB) by mmap, or from
# the top of its heap, and returns them to the kernel when they are freed, so every step
# faults its activations in again, page by page: thousands of minor faults a step for lenet at
# 1 rank (`/usr/bin/time`), a large share of its time in the kernel, a cost that moves with the
# host's load on a VM. Alternated, glibc as it comes ran the peer at less than half its speed
# with freed memory kept (tcmalloc, or glibc's mmap and trim thresholds raised), for lenet and
# resnet20 alike (docs/performance.md, "Method"). PyTorch's own CPU launcher
# (torch.backends.xeon.run_cpu) preloads tcmalloc (or jemalloc where tcmalloc is missing) for
# this reason, and ddpv-train keeps its tensors from step to step (Note [Grow-only
# activations] in layer.cpp). So the peer runs under tcmalloc where it is installed
# (`scripts/install-deps.sh --bench`), else under glibc with both thresholds raised; the
# result records which. --allocator system measures glibc as it comes. The allocator has to
# be in place before the interpreter starts, so the script runs itself again under it; the
# ranks that torch.multiprocessing.spawn starts inherit it, and each checks that it runs under
# it (check_allocator).
ALLOCATORS = ("auto", "tcmalloc", "glibc-retain", "system")
GLIBC_RETAIN = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20),  # glibc's largest (64-bit)
                "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def run_under_allocator(argv):
    """Runs this script again under the allocator that --allocator names (default auto:
    tcmalloc where found, else glibc-retain), unless it already runs under it."""
    if os.environ.get("DDPV_PEER_ALLOCATOR"):
        return
    want = "auto"
    for i, a in enumerate(argv):
        if a == "--allocator" and i + 1 < len(argv):
            want = argv[i + 1]
        elif a.startswith("--allocator="):
            want = a.split("=", 1)[1]
    if want not in ALLOCATORS:
        return  # parse_args says what is wrong
    env = dict(os.environ)
    lib = None
    if want in ("auto", "tcmalloc"):
        lib = ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc")
        if lib is None and want == "tcmalloc":
            sys.exit("torch_ddp.py: --allocator tcmalloc: no libtcmalloc found; install "
                     "libtcmalloc-minimal4 (scripts/install-deps.sh --bench) or use "
                     "--allocator glibc-retain")
    if lib is not None:
        env["LD_PRELOAD"] = ":".join(x for x in (lib, env.get("LD_PRELOAD")) if x)
        env["DDPV_PEER_ALLOCATOR"] = f"tcmalloc ({lib})"
    elif want in ("auto", "glibc-retain"):
        env.update(GLIBC_RETAIN)
        env["DDPV_PEER_ALLOCATOR"] = "glibc, freed memory kept (" + ", ".join(
            f"{k}={v}" for k, v in GLIBC_RETAIN.items()) + ")"
    else:
        env["DDPV_PEER_ALLOCATOR"] = "system (glibc as it comes)"
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + argv, env)


if __name__ == "__main__":
    run_under_allocator(sys.argv[1:])

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import ddpv_torch  # noqa: E402  (scripts/ddpv_torch.py: the twins of our model zoo)

# A 1-channel conv weight (lenet's conv1) has ambiguous strides; DDP copes, but warns each run.
warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")

INPUT_HWC = {"lenet": (28, 28, 1), "resnet20": (32, 32, 3), "resnet56": (32, 32, 3),
             "resnet50": (224, 224, 3)}
CLASSES = {"resnet50": 1000}  # as ddpv-train --synthetic (src/train/batch_source.cpp); else 10
FORMATS = {"nchw": torch.contiguous_format, "channels_last": torch.channels_last}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="torch_ddp.py", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="lenet", choices=sorted(INPUT_HWC))
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=0.01, help="for the global batch, as ddpv-train")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--formats", default="nchw,channels_last",
                   help="memory formats to measure, in this order (nchw, channels_last)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: autocast to bfloat16 around forward and loss, as AMP")
    p.add_argument("--compile", action="store_true",
                   help="train the torch.compile'd model (PyTorch 2 and later)")
    p.add_argument("--isa", action="store_true",
                   help="after timing, one step with oneDNN's verbose log on: record which "
                   "convolution implementations (and so which ISA) oneDNN chose")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per format")
    p.add_argument("--steps", type=int, default=30, help="timed steps per format")
    p.add_argument("--fashion-mnist", metavar="STORE", default="",
                   help="train lenet on this HDF5 store (ddpv-convert idx) and time the target")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--lr-schedule", default="cosine", choices=["cosine", "constant"])
    p.add_argument("--target", type=float, default=0.91, help="test accuracy to time")
    p.add_argument("--run-all-epochs", action="store_true",
                   help="keep training after the target is reached (default: stop there)")
    p.add_argument("--json", default="", help="also write the result object here")
    p.add_argument("--allocator", default="auto", choices=ALLOCATORS,
                   help="malloc for PyTorch's tensors (Note [Peer allocator]): auto (tcmalloc "
                   "where installed, else glibc-retain), tcmalloc, glibc-retain (glibc keeping "
                   "freed memory) or system (glibc as it comes)")
    a = p.parse_args(argv)
    a.input_hwc = None  # the model's default input; a store's own size in --fashion-mnist
    if a.world_size < 1 or a.threads < 1 or a.batch_size < 1:
        p.error("--world-size, --threads and --batch-size must be at least 1")
    for f in a.formats.split(","):
        if f not in FORMATS:
            p.error(f"--formats: unknown format '{f}' (use nchw and/or channels_last)")
    if a.compile and not hasattr(torch, "compile"):
        p.error(f"--compile: PyTorch {torch.__version__} has no torch.compile (PyTorch 2 has)")
    if a.fashion_mnist:
        a.model = "lenet"
        if len(a.formats.split(",")) != 1:
            a.formats = "nchw"  # one run; bench.sh passes the format that won the lenet race
    return a


def build(args, fmt):
    """The model with ours' initialisation, its DDP wrapper (world > 1) and the SGD optimizer."""
    torch.manual_seed(args.seed)
    model = ddpv_torch.make_model(args.model, args.input_hwc or INPUT_HWC[args.model],
                                  CLASSES.get(args.model, 10))
    for m in model.modules():
        if isinstance(m, nn.Conv2d) and args.model != "lenet":
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    model = model.to(memory_format=FORMATS[fmt])
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": args.weight_decay},
                           {"params": no_decay, "weight_decay": 0.0}],
                          lr=args.lr, momentum=args.momentum)
    if args.world_size > 1:
        # Broadcasts rank 0's parameters once. No per-step buffer broadcast: ours keeps each
        # rank's BatchNorm statistics and averages them before evaluation only.
        model = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    if args.compile:
        model = torch.compile(model)
    return model, opt


def train_step(model, opt, x, y, bf16=False):
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()


def conv_implementations(step):
    """The oneDNN convolution implementations that one call of step() ran, from oneDNN's
    verbose log (written to the process's stdout, so fd 1 is redirected around the call)."""
    from onednn_verbose import conv_implementations as parse
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+") as log:
        os.dup2(log.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                step()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        return parse(log.read())


def barrier(args):
    if args.world_size > 1:
        dist.barrier()


def synthetic(args, rank):
    """images/s of each memory format over the timed steps, warm-up excluded."""
    h, w, c = INPUT_HWC[args.model]
    g = torch.Generator().manual_seed(1000 + rank)
    batches = [(torch.randn(args.batch_size, c, h, w, generator=g),
                torch.randint(0, CLASSES.get(args.model, 10), (args.batch_size,), generator=g))
               for _ in range(2)]
    bf16 = args.precision == "bf16"
    result = {}
    for fmt in args.formats.split(","):
        model, opt = build(args, fmt)
        model.train()
        data = [(x.contiguous(memory_format=FORMATS[fmt]), y) for x, y in batches]
        for i in range(args.warmup):
            train_step(model, opt, *data[i % 2], bf16=bf16)
        barrier(args)
        t0 = time.perf_counter()
        for i in range(args.steps):
            train_step(model, opt, *data[i % 2], bf16=bf16)
        barrier(args)
        seconds = time.perf_counter() - t0
        result[fmt] = {"images_per_s": args.world_size * args.batch_size * args.steps / seconds,
                       "timed_s": seconds}
        if args.isa:  # every rank steps (DDP's allreduce), rank 0 keeps the log
            step = lambda: train_step(model, opt, *data[0], bf16=bf16)  # noqa: E731
            impls = conv_implementations(step) if rank == 0 else step()
            if rank == 0:
                result[fmt]["conv_impls"] = impls
        del model, opt
    best = max(result, key=lambda f: result[f]["images_per_s"])
    return {"mode": "synthetic", "formats": result, "best_format": best,
            "images_per_s": result[best]["images_per_s"]}


def load_split(store, split):
    """(images (N, 1, H, W) float32 normalised like our loader, labels int64) of one split."""
    import h5py
    import numpy as np
    with h5py.File(store, "r") as f:
        mean = np.asarray(f.attrs["mean"], dtype=np.float32)
        std = np.asarray(f.attrs["std"], dtype=np.float32)
        raw = f[split]["images"][...]                       # (N, H, W, C) uint8
        labels = f[split]["labels"][...].astype(np.int64)
    # Our loader's arithmetic, in float32: (v / 255 - mean[c]) * (1 / std[c]).
    x = (raw.astype(np.float32) / np.float32(255) - mean) * (np.float32(1) / std)
    return torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(labels)


def evaluate(args, model, x, y, rank, fmt):
    """Test accuracy: each rank its unpadded shard (as ours), one allreduce of the counts.
    The shards differ by a sample, so no collective may run per batch: the bare module."""
    model = getattr(model, "module", model)
    model.eval()
    idx = torch.arange(rank, x.shape[0], args.world_size)
    correct = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for b in range(0, idx.numel(), args.batch_size):
            i = idx[b:b + args.batch_size]
            out = model(x[i].contiguous(memory_format=FORMATS[fmt]))
            correct[0] += (out.argmax(1) == y[i]).sum()
            correct[1] += i.numel()
    if args.world_size > 1:
        dist.all_reduce(correct)
    model.train()
    return float(correct[0] / correct[1])


def fashion_mnist(args, rank):
    """Wall time from the first step to the first epoch whose test accuracy reaches the target."""
    from torch.utils.data.distributed import DistributedSampler
    fmt = args.formats.split(",")[0]
    x_train, y_train = load_split(args.fashion_mnist, "train")
    x_test, y_test = load_split(args.fashion_mnist, "test")
    args.input_hwc = (x_train.shape[2], x_train.shape[3], x_train.shape[1])
    model, opt = build(args, fmt)
    model.train()
    sampler = DistributedSampler(range(x_train.shape[0]), num_replicas=args.world_size, rank=rank,
                                 shuffle=True, seed=args.seed, drop_last=False)
    steps_per_epoch = math.ceil(len(sampler) / args.batch_size)
    total = steps_per_epoch * args.epochs
    trace, reached, step = [], None, 0
    barrier(args)
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(iter(sampler)))
        for b in range(0, order.numel(), args.batch_size):
            i = order[b:b + args.batch_size]
            lr = args.lr
            if args.lr_schedule == "cosine":  # ours: base * (1 + cos(pi * step / total)) / 2
                lr = args.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, step / total)))
            for group in opt.param_groups:
                group["lr"] = lr
            train_step(model, opt, x_train[i].contiguous(memory_format=FORMATS[fmt]), y_train[i])
            step += 1
        acc = evaluate(args, model, x_test, y_test, rank, fmt)
        elapsed = time.perf_counter() - t0
        trace.append({"epoch": epoch + 1, "val_acc": acc, "elapsed_s": elapsed})
        if rank == 0:
            print(f"torch_ddp: epoch {epoch + 1}/{args.epochs} val_acc {acc:.4f} "
                  f"elapsed {elapsed:.1f} s", file=sys.stderr, flush=True)
        if reached is None and acc >= args.target:
            reached = trace[-1]
            if not args.run_all_epochs:
                break
    return {"mode": "fashion-mnist", "format": fmt, "target": args.target, "trace": trace,
            "reached_epoch": reached["epoch"] if reached else None,
            "time_to_target_s": reached["elapsed_s"] if reached else None,
            "images_per_s": step * args.batch_size * args.world_size / trace[-1]["elapsed_s"]}


def blas_library():
    """The BLAS that torch loaded (its linear layers run on it): the reference netlib BLAS is
    ~15x slower than OpenBLAS, so scripts/bench.sh points the peer at OpenBLAS."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if "blas" in line.split()[-1]}
    except OSError:
        return "unknown"
    names = sorted(os.path.join(os.path.basename(os.path.dirname(x)), os.path.basename(x))
                   for x in libs)
    return ", ".join(names) or "none found"


def check_allocator():
    """Fails unless this process runs under the allocator its environment names (Note [Peer
    allocator]): a rank that lost it would be measured under glibc as it comes."""
    name = os.environ.get("DDPV_PEER_ALLOCATOR", "")
    if name.startswith("tcmalloc"):
        with open("/proc/self/maps") as f:
            ok = any("tcmalloc" in line for line in f)
    elif name.startswith("glibc"):
        ok = all(os.environ.get(k) == v for k, v in GLIBC_RETAIN.items())
    else:
        ok = True
    if not ok:
        raise RuntimeError(f"torch_ddp.py: pid {os.getpid()} does not run under {name}")


def run(rank, args, init_file):
    check_allocator()
    torch.set_num_threads(args.threads)
    if args.world_size > 1:
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                                world_size=args.world_size)
    try:
        out = fashion_mnist(args, rank) if args.fashion_mnist else synthetic(args, rank)
        if rank == 0:
            out.update(model=args.model, world_size=args.world_size, threads=args.threads,
                       batch_size=args.batch_size, precision=args.precision,
                       compiled=args.compile, torch=torch.__version__, blas=blas_library(),
                       allocator=os.environ.get("DDPV_PEER_ALLOCATOR", "system (not chosen)"))
            text = json.dumps(out)
            print(text, flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    f.write(text + "\n")
    finally:
        if args.world_size > 1:
            dist.destroy_process_group()


def main(argv):
    args = parse_args(argv)
    if args.world_size == 1:
        run(0, args, "")
        return 0
    with tempfile.TemporaryDirectory(prefix="torch_ddp.") as tmp:
        torch.multiprocessing.spawn(run, args=(args, os.path.join(tmp, "rendezvous")),
                                    nprocs=args.world_size, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
