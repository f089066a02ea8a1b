"""openinfer: the KV-cache orchestration of a Qwen3 serving engine, re-implemented once.

The same scheduler (``openinfer.scheduler``) and KvStore (``openinfer.kv``) run on a
simulated clock (``sim/``) and on a real GPU (``openinfer.models.qwen3``); the only thing
that differs between the two worlds is the :class:`openinfer.runtime.Runtime` they get.
"""
