"""``experiments.validate``: the real-GPU report of issue #6 and the timing capture of #8.

Run as ``python -m experiments.validate report=PATH``; see ``main.py`` for the keys.
Without a GPU the Triton kernels run in the interpreter, which must be chosen before
triton is first imported, hence here.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
