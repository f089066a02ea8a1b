"""Write a seeded random Qwen3 checkpoint in the HF layout (config.json + model.safetensors).

No real weights are available, so tests and benchmarks run on random ones that still
behave like a model: projections are N(0, 1/fan_in) so activations keep their scale over
36 layers, norm weights are 1 + 0.1*N(0,1) so they matter, and embeddings are
N(0, 1/hidden) so tied logits have std ~1 (neither uniform nor one-hot).

The safetensors file is written by hand, tensor by tensor: the header is computable from
the shapes alone, so an 8B fp32 checkpoint (32 GB) never sits in host memory at once, as
it would with ``safetensors.torch.save_file``. Each tensor has its own generator seeded
from (seed, name), so a tensor's values don't depend on which others were written.
"""

from __future__ import annotations

import json
import math
import struct
import zlib
from pathlib import Path

import torch

from openinfer.errors import require
from openinfer.models.qwen3.config import DTYPES, Qwen3Config
from openinfer.models.qwen3.weights import EMBED, LM_HEAD, expected_shapes

_ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def random_tensor(name: str, shape: tuple[int, ...], cfg: Qwen3Config, seed: int,
                  dtype: torch.dtype, device: str | torch.device = "cpu") -> torch.Tensor:
    """The deterministic random value of one named checkpoint tensor, drawn on ``device``
    (a CUDA generator's stream is not the CPU's: the values depend on the device too)."""
    gen = torch.Generator(device=device).manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
    x = torch.randn(shape, generator=gen, dtype=torch.float32, device=device)
    if len(shape) == 1:                       # every 1-D tensor of Qwen3 is an RMSNorm weight
        x = x.mul_(0.1).add_(1.0)
    elif name in (EMBED, LM_HEAD):
        x = x.mul_(1.0 / math.sqrt(cfg.hidden_size))
    else:
        x = x.mul_(1.0 / math.sqrt(shape[1]))  # fan_in of an nn.Linear weight [out, in]
    return x.to(dtype)


def write_safetensors_streaming(path: Path, specs: dict[str, tuple[int, ...]],
                                dtype: torch.dtype, make) -> None:
    """Write a safetensors file whose tensors come one at a time from ``make(name, shape)``."""
    item = torch.empty((), dtype=dtype).element_size()
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in specs.items():
        nbytes = math.prod(shape) * item
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)             # data must start 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape in specs.items():
            t = make(name, shape).contiguous()
            assert t.dtype == dtype and tuple(t.shape) == shape, name
            f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            del t


def write_config(cfg: Qwen3Config, out_dir: str | Path, dtype: str) -> Path:
    """Create ``out_dir`` with the HF config.json of ``cfg`` stored as ``dtype``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hf = cfg.to_hf_dict()
    hf["torch_dtype"] = dtype
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    return out


def write_random_checkpoint(cfg: Qwen3Config, out_dir: str | Path, seed: int = 0,
                            dtype: str = "bfloat16", device: str | torch.device = "cpu") -> Path:
    """Create ``out_dir`` with config.json (HF Qwen3 layout) and model.safetensors, the
    values drawn on ``device`` (a GPU writes a 4B checkpoint in seconds, not a minute)."""
    require(dtype in DTYPES, "dtype", dtype, f"one of {sorted(DTYPES)}")
    require(isinstance(seed, int) and seed >= 0, "seed", seed, "an int >= 0")
    tdtype = DTYPES[dtype]
    out = write_config(cfg, out_dir, dtype)
    write_safetensors_streaming(
        out / "model.safetensors", expected_shapes(cfg), tdtype,
        lambda name, shape: random_tensor(name, shape, cfg, seed, tdtype, device).cpu())
    return out
