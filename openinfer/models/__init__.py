"""Real model implementations that run on the paged KV arena (``openinfer.models.qwen3``)."""
