"""The SimPy world: models of the GPU, copy engines, tiers, peers and the MetaServer that
the unchanged scheduler and KvStore run against in virtual time.

Single-instance serving simulation (one job per module):

* ``hardware`` / ``model_geometry`` — HardwareSpec presets (h200, rtx5090) and HF-config
  geometry (qwen3-0.6b/4b/8b): the numbers a roofline needs.
* ``step_features`` / ``step_model`` / ``calibrated_step_model`` — a step plan reduced to
  counts; roofline ``step_time(plan)``; a least-squares fitted model behind the same call.
* ``gpu_executor`` — SimExecutor: FakeExecutor's seeded tokens timed by a step model.
* ``copy_queue`` — FIFO copy engines computed arithmetically (one event per copy).
* ``arrivals`` / ``lengths`` / ``tokens`` / ``traces`` / ``workloads`` / ``client`` —
  Poisson/gamma arrivals, length distributions, key-derived prompt text, JSONL/Mooncake
  traces, random/synthetic/chat/trace workloads, and the client that submits, aborts and
  records.
* ``metrics`` / ``timeline`` / ``capacity`` — vllm-bench-named metrics, bounded per-step
  samples, a saturation-rate estimate.
* ``world`` — build one instance from a WorldConfig and run a workload to a report.
"""
