#!/usr/bin/python3
"""Writes the golden tensors of tests/golden/*.h5 with PyTorch, an implementation independent
of ours: the models of scripts/ddpv_torch.py, deterministic weights and inputs, one training-mode
forward and backward. The C++ test (tests/unit/golden_test.cpp) loads the same weights and
input, runs our forward and backward, and compares logits, loss, every gradient and the updated
BatchNorm running statistics.

Regenerate (needs Debian's python3-torch and python3-h5py):
    /usr/bin/python3 tests/golden/make_golden.py [--bf16-only]

Note [bf16 reference]: the GPU test of --precision bf16 (tests/unit/cuda_parity_test.cpp)
cannot hold bf16 to float32's tolerances: rounding every convolution's and linear layer's
inputs to 8 bits of mantissa moves the gradients of these tiny-batch cases by 10-50% (relative
norm). What it can hold us to is PyTorch's own bf16 error on the same case. So each file also
stores, per parameter, the relative norm error of PyTorch's CPU autocast-bf16 gradient (the
model in float32, the file's values) against the float64 reference, in bf16_grad_error/<name>.
--bf16-only adds those to the existing files without rewriting the reference.
"""
import os
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
from ddpv_torch import make_model  # noqa: E402

CASES = [  # name, (H, W, C), classes, batch
    ("lenet", (28, 28, 1), 10, 4),
    ("resnet20", (32, 32, 3), 10, 4),
]


# Note [ReLU margin]: the reference is float64, ours float32. A ReLU input within float32's
# error (about 1e-6 here) of zero may take the other side in our run, which changes the
# gradient of everything before it by far more than the test's tolerance (one such element,
# 1.7e-6 from zero, moved resnet20's early gradients by 0.3%). So the seed is advanced until
# every ReLU input is at least RELU_MARGIN from zero.
RELU_MARGIN = 1e-5


class ReluMargin:
    """Records the smallest |input| of every F.relu called inside the block."""

    def __enter__(self):
        self.smallest = float("inf")
        self.relu = F.relu

        def probe(x, *args, **kwargs):
            self.smallest = min(self.smallest, x.detach().abs().min().item())
            return self.relu(x, *args, **kwargs)

        F.relu = probe
        return self

    def __exit__(self, *exc):
        F.relu = self.relu


def draw_case(name, hwc, classes, batch, seed):
    torch.manual_seed(seed)
    model = make_model(name, hwc, classes).double()
    with torch.no_grad():  # non-trivial BatchNorm affine parameters
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
        # The file stores float32: compute the float64 reference from exactly those values.
        for v in model.state_dict().values():
            if v.is_floating_point():
                v.copy_(v.float().double())
    model.train()
    x = (torch.rand(batch, hwc[2], hwc[0], hwc[1], dtype=torch.float64) * 2 - 1).float().double()
    labels = torch.randint(0, classes, (batch,))
    params0 = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with ReluMargin() as margin:
        logits = model(x)
    return model, x, labels, params0, logits, margin.smallest


def write_case(name, hwc, classes, batch):
    seed = 1234
    while True:
        model, x, labels, params0, logits, smallest = draw_case(name, hwc, classes, batch, seed)
        if smallest >= RELU_MARGIN:
            break
        seed += 1
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    path = os.path.join(HERE, f"{name}.h5")
    with h5py.File(path, "w") as f:
        f.attrs["model"] = name
        f.attrs["generator"] = f"torch {torch.__version__}, float64, training mode, seed {seed}"
        f["input"] = x.permute(0, 2, 3, 1).contiguous().float().numpy()  # NHWC
        f["labels"] = labels.int().numpy()
        f["logits"] = logits.detach().float().numpy()
        f["loss"] = np.array([loss.item()], dtype=np.float32)
        for k, v in params0.items():
            if k.endswith("num_batches_tracked"):
                continue
            group = "buffers_before" if ("running" in k) else "params"
            f[f"{group}/{k}"] = v.float().numpy()
        for k, v in model.state_dict().items():
            if "running" in k:
                f[f"buffers_after/{k}"] = v.float().numpy()
        for k, p in model.named_parameters():
            f[f"grads/{k}"] = p.grad.float().numpy()
    print(f"wrote {path}: seed {seed}, loss {loss.item():.6f}, ReLU inputs >= {smallest:.2g} from 0")
    write_bf16_reference(name, hwc, classes)


def write_bf16_reference(name, hwc, classes):
    """Note [bf16 reference]: PyTorch's autocast-bf16 gradient error, per parameter."""
    path = os.path.join(HERE, f"{name}.h5")
    with h5py.File(path, "a") as f:
        model = make_model(name, hwc, classes).float()
        state = model.state_dict()
        for k, v in state.items():
            if not k.endswith("num_batches_tracked"):
                group = "buffers_before" if "running" in k else "params"
                v.copy_(torch.from_numpy(f[f"{group}/{k}"][()]))
        model.train()
        x = torch.from_numpy(f["input"][()]).permute(0, 3, 1, 2).contiguous()
        labels = torch.from_numpy(f["labels"][()]).long()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        F.cross_entropy(logits.float(), labels).backward()
        if "bf16_grad_error" in f:
            del f["bf16_grad_error"]
        errors = []
        for k, p in model.named_parameters():
            ref = f[f"grads/{k}"][()].astype(np.float64)
            err = np.linalg.norm(p.grad.double().numpy() - ref) / np.linalg.norm(ref)
            f[f"bf16_grad_error/{k}"] = np.array([err], dtype=np.float32)
            errors.append(err)
        f.attrs["bf16_generator"] = f"torch {torch.__version__}, CPU autocast bfloat16"
    print(f"{path}: PyTorch bf16 gradient error median {np.median(errors):.3f}, "
          f"max {np.max(errors):.3f}")


if __name__ == "__main__":
    for case in CASES:
        if "--bf16-only" in sys.argv:
            write_bf16_reference(*case[:3])
        else:
            write_case(*case)
