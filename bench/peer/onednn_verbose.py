"""What oneDNN says it ran, for the precision rows of `make bench`: the convolution
implementations in its verbose log (their names carry the ISA: "brgconv:avx512_core_amx_bf16",
"jit:avx2", "gemm:ref"), for PyTorch's log and ours alike, and whether this CPU has native bf16.
"""


def conv_implementations(text):
    """Sorted "implementation (propagation)" strings of the convolutions a verbose log ran.
    Reads oneDNN 2's lines ("dnnl_verbose,exec,cpu,convolution,jit:avx2,forward_training,...")
    and oneDNN 3's ("onednn_verbose[,v1][,timestamp],primitive,exec,cpu,convolution,...")."""
    found = set()
    for line in text.splitlines():
        if "verbose" not in line.split(",", 1)[0]:
            continue
        fields = [f.strip() for f in line.split(",")]
        if "exec" not in fields:
            continue
        rest = fields[fields.index("exec") + 1:]
        if "convolution" not in rest[:3]:
            continue
        i = rest.index("convolution")
        if i + 2 < len(rest):
            found.add(f"{rest[i + 1]} ({rest[i + 2]})")
    return sorted(found)


def native_bf16(cpuinfo_path="/proc/cpuinfo"):
    """The CPU's native bf16 arithmetic, "amx_bf16" or "avx512_bf16", or None (oneDNN then
    emulates bf16 on AVX-512 and refuses bf16 convolutions on AVX2)."""
    try:
        with open(cpuinfo_path) as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
    except OSError:
        return None
    for name in ("amx_bf16", "avx512_bf16"):
        if name in flags:
            return name
    return None


def best_isa(impls):
    """The widest ISA named in a list of implementations (for one word in a table)."""
    order = ("amx", "avx512_core_bf16", "avx512", "avx2", "sse41", "ref", "gemm")
    for key in order:
        for impl in impls:
            if key in impl:
                return impl.split(" ")[0]
    return impls[0].split(" ")[0] if impls else "none seen"
