"""Triton kernels of the Qwen3 forward, each with a pure-torch twin in ``reference``.

Importing this package applies the TRITON_INTERPRET compatibility patch (CPU tests).
"""

from openinfer.models.qwen3.kernels._interpret import patch_interpreter

patch_interpreter()

from openinfer.models.qwen3.kernels.decode_attention import (  # noqa: E402
    QKVParts, can_take_qkv, decode_attention, default_num_splits)
from openinfer.models.qwen3.kernels.norm import rms_norm  # noqa: E402
from openinfer.models.qwen3.kernels.prefill_attention import prefill_attention  # noqa: E402
from openinfer.models.qwen3.kernels.qkv_rope import qkv_norm_rope_write  # noqa: E402
from openinfer.models.qwen3.kernels.skinny_linear import (  # noqa: E402
    MAX_ROWS, SkinnyConfig, norm_in_tail, skinny_gated, skinny_linear,
    skinny_linear_add_rms_norm)

__all__ = ["MAX_ROWS", "QKVParts", "SkinnyConfig", "can_take_qkv", "decode_attention",
           "default_num_splits", "norm_in_tail", "prefill_attention", "qkv_norm_rope_write",
           "rms_norm", "skinny_gated", "skinny_linear", "skinny_linear_add_rms_norm"]
