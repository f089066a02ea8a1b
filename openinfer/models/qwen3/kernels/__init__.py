"""Triton kernels of the Qwen3 forward, each with a pure-torch twin in ``reference``.

Importing this package applies the TRITON_INTERPRET compatibility patch (CPU tests).
"""

from openinfer.models.qwen3.kernels._interpret import patch_interpreter

patch_interpreter()

from openinfer.models.qwen3.kernels.decode_attention import (  # noqa: E402
    decode_attention, default_num_splits)
from openinfer.models.qwen3.kernels.kv_write import write_kv  # noqa: E402
from openinfer.models.qwen3.kernels.norm import qk_norm_rope, rms_norm  # noqa: E402
from openinfer.models.qwen3.kernels.prefill_attention import prefill_attention  # noqa: E402

__all__ = ["decode_attention", "default_num_splits", "prefill_attention", "qk_norm_rope",
           "rms_norm", "write_kv"]
