"""Suite-wide set-up that must happen before any test module is imported.

Without a GPU the Triton kernels run in the interpreter. TRITON_INTERPRET is read when a
module imports triton (and some test modules read it at import to decide a skip), so it
is set here, in the root conftest, which pytest imports before collecting any directory:
set in a subfolder's conftest it came too late for modules collected earlier
(tests/backend before tests/models). With a GPU, and the variable unset, the same tests
run the compiled kernels.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
