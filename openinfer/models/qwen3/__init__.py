"""Qwen3 over a paged KV arena: config, weights, random checkpoints, model, kernels, sampling.

Runtime code never imports HF transformers; tests use it only as the reference.
"""

from openinfer.models.qwen3.batch import ForwardBatch, SeqInput
from openinfer.models.qwen3.checkpoint import write_random_checkpoint
from openinfer.models.qwen3.config import PRESETS, Qwen3Config, preset
from openinfer.models.qwen3.kv_arena import KVArena
from openinfer.models.qwen3.model import Qwen3Model
from openinfer.models.qwen3.sampling import SamplingParams, SamplingTensors, greedy, sample
from openinfer.models.qwen3.weights import Qwen3Weights, WeightError, load_weights

__all__ = ["PRESETS", "ForwardBatch", "KVArena", "Qwen3Config", "Qwen3Model", "Qwen3Weights",
           "SamplingParams", "SamplingTensors", "SeqInput", "WeightError", "greedy",
           "load_weights", "preset", "sample", "write_random_checkpoint"]
