"""What this CPU offers in half precision: the facts `TF_MPT_DTYPE=auto` decides from.

No TensorFlow import. The flags come from /proc/cpuinfo, or from TF_MPT_CPU_FLAGS when set
(tests run the `auto` decision of every CPU kind on any machine that way).

    native bfloat16  = avx512_bf16 or amx_bf16 (oneDNN computes in bfloat16: MatMul 1.9x on
                       Zen 4, 4.3x with AMX; without them bfloat16 MatMul is 0.67x float32)
    Grappler bf16    = avx512f or avx_ne_convert (TensorFlow's gate for its oneDNN bfloat16
                       pass, tensorflow/core/util/util.cc; without them that pass is a no-op)
"""

import glob
import os

CPUINFO = "/proc/cpuinfo"
# device files of GPUs TensorFlow could run on: NVIDIA's, WSL's, AMD's (ROCm)
GPU_DEVICE_FILES = ("/dev/nvidia[0-9]*", "/dev/dxg", "/dev/kfd")
NATIVE_BFLOAT16_FLAGS = ("avx512_bf16", "amx_bf16")
GRAPPLER_BFLOAT16_FLAGS = ("avx512f", "avx_ne_convert")


def _first(field, path):
    """The value of the first `field: value` line of `path`, or None."""
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == field:
                    return value
    except OSError:
        pass
    return None


def real_cpu_flags(path=CPUINFO):
    """The flags of the first processor in `path` (empty when it cannot be read)."""
    return frozenset((_first("flags", path) or "").split())


def cpu_model(path=CPUINFO):
    """The CPU's model name, or 'unknown CPU'."""
    return (_first("model name", path) or "").strip() or "unknown CPU"


def gpu_device_present(patterns=GPU_DEVICE_FILES):
    """Whether this machine has a GPU device file (without TensorFlow: whether TensorFlow can
    see a GPU needs its import; none of these files, it sees none)."""
    return any(glob.glob(pattern) if "*" in pattern else os.path.exists(pattern)
               for pattern in patterns)


def cpu_flags(config=None):
    """TF_MPT_CPU_FLAGS (via `config`) when set, else the real CPU's flags."""
    if config is not None and config.cpu_flags is not None:
        return config.cpu_flags
    return real_cpu_flags()


# TensorFlow's remapper fusions on an x86 CPU (oneDNN) that the cost model knows, by name (a
# target has a set of them; a fused op costs nothing, or its half time where only float32
# fuses it; rewrite/paint/cost.py `fusion`):
#   contraction_bias_activation  matrix product / convolution -> BiasAdd -> [Add] ->
#                                [activation], in either dtype
#   swish                        x * sigmoid(beta * x) as one kernel, in either dtype
#   conv_batch_norm              Conv2D / depthwise -> inference FusedBatchNorm -> [Relu ...],
#                                in float32 only
#   batch_norm_relu              training FusedBatchNorm -> Relu (_FusedBatchNormEx), in
#                                either dtype
REMAPPER_FUSIONS = frozenset(("contraction_bias_activation", "swish", "conv_batch_norm",
                              "batch_norm_relu"))

# The flags that change a half kernel's speed: what a measured table is keyed by.
HALF_SPEED_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16", "f16c")


def identity(config=None):
    """This CPU as tf_mpt sees it, one idea per process: its model and the flags that set
    half-precision speed, from TF_MPT_CPU_FLAGS (via `config`) when set, else /proc/cpuinfo.
    What `auto` decides from and what this CPU's kernel-time cache is keyed by."""
    flags = cpu_flags(config)
    injected = config is not None and config.cpu_flags is not None
    return (f"{cpu_model()}{' (flags injected)' if injected else ''}: "
            f"{' '.join(f for f in HALF_SPEED_FLAGS if f in flags) or 'no half flags'}")


def has_native_bfloat16(flags):
    return any(flag in flags for flag in NATIVE_BFLOAT16_FLAGS)


def grappler_bfloat16_runs(flags):
    return any(flag in flags for flag in GRAPPLER_BFLOAT16_FLAGS)


def auto_dtype(gpu_visible, flags):
    """What TF_MPT_DTYPE=auto picks: 'float16' with a GPU, 'bfloat16' with native bfloat16,
    else None (the script stays float32)."""
    if gpu_visible:
        return "float16"
    return "bfloat16" if has_native_bfloat16(flags) else None


def facts(config=None, gpu_visible=False):
    """Human-readable lines: the CPU, native bfloat16 yes/no, and what `auto` picks."""
    flags = cpu_flags(config)
    injected = config is not None and config.cpu_flags is not None
    native = [f for f in NATIVE_BFLOAT16_FLAGS if f in flags]
    source = "TF_MPT_CPU_FLAGS (injected)" if injected else CPUINFO
    picked = auto_dtype(gpu_visible, flags)
    return [
        f"CPU: {cpu_model()} (flags from {source})",
        "native bfloat16: " + (f"yes ({', '.join(native)})" if native else
                               f"no (no {' or '.join(NATIVE_BFLOAT16_FLAGS)})"),
        # TensorFlow's own gate reads the real CPU, whatever TF_MPT_CPU_FLAGS says
        "Grappler's bfloat16 pass: " + ("runs" if grappler_bfloat16_runs(real_cpu_flags()) else
                                        f"a no-op (no {' or '.join(GRAPPLER_BFLOAT16_FLAGS)})"),
        f"GPU visible: {'yes' if gpu_visible else 'no'}",
        "TF_MPT_DTYPE=auto picks: " + (picked or "float32 (no fast half type; a warning says so)"),
    ]
