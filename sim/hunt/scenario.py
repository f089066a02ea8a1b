"""A hunt scenario: a small, fully explicit world and workload, replayable from JSON.

Small configurations find bugs fastest: a few requests, a pool of tens of pages, short
prompts over small blocks, arrivals bunched together, a random subset of fault ports on
(swarm testing), and a random order for simultaneous events.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field

from sim.faults import FaultSpec


@dataclass
class ReqSpec:
    t: float
    prompt: list[int]
    max_tokens: int
    lora: str | None = None
    cancel_at: float | None = None
    echo: bool = False
    logprobs: bool = False


@dataclass
class ControlSpec:
    t: float
    op: str
    adapter: str | None = None


@dataclass
class Scenario:
    seed: int
    variant: str = "fixed"
    order: str = "random"
    block_size: int = 4
    num_blocks: int = 24
    host_blocks: int = 256
    role: str = "mixed"
    peer: bool = False
    lora_control: bool = False
    adapters: list[str] = field(default_factory=list)
    max_prefill_tokens: int = 32
    max_context_tokens: int = 100_000
    resolve_deadline_s: float = 15.0
    flush_deadline_s: float = 5.0
    teardown_at: float | None = None  # call flush_loads mid-run: a teardown barrier must drain DMAs
    seeded_prefixes: list[list[int]] = field(default_factory=list)
    requests: list[ReqSpec] = field(default_factory=list)
    controls: list[ControlSpec] = field(default_factory=list)
    faults: list[FaultSpec] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> Scenario:
        d = dict(d)
        d["requests"] = [ReqSpec(**r) for r in d.get("requests", [])]
        d["controls"] = [ControlSpec(**c) for c in d.get("controls", [])]
        d["faults"] = [FaultSpec(**f) for f in d.get("faults", [])]
        return cls(**d)

    def size(self) -> int:
        """What shrinking minimises, roughly: parts, then tokens."""
        return (10_000 * (len(self.requests) + len(self.faults) + len(self.controls)
                          + len(self.seeded_prefixes))
                + sum(len(r.prompt) + r.max_tokens for r in self.requests)
                + sum(len(p) for p in self.seeded_prefixes) + self.num_blocks)


# Which fault kinds make sense at which port: a lost (blackholed) DMA would leak pages for
# ever by design (H10), so copies only stall until the heal, are delayed, or fail.
PORT_KINDS = {
    "query": ("stall", "blackhole", "delay", "error"),
    "load": ("stall", "delay", "error"),
    "save": ("stall", "delay", "error"),
    "flush": ("stall", "blackhole", "delay", "error"),
    "registration": ("stall", "blackhole", "delay", "error"),
    "metaserver": ("stall", "blackhole", "delay", "error"),
    "step": ("error",),
}


def random_scenario(rng: random.Random, seed: int, variant: str) -> Scenario:
    bs = rng.choice([4, 4, 8, 16])
    num_blocks = rng.randint(8, 40)
    usable = num_blocks - 1
    role = rng.choice(["mixed", "mixed", "prefill"])
    lora_control = rng.random() < 0.3
    sc = Scenario(seed=seed, variant=variant, order=rng.choice(["fifo", "random", "random", "pct"]),
                  block_size=bs, num_blocks=num_blocks, host_blocks=rng.choice([16, 64, 512]),
                  role=role, peer=role == "prefill" or rng.random() < 0.3, lora_control=lora_control,
                  adapters=["A"] if lora_control else [],
                  max_prefill_tokens=rng.choice([2 * bs, 4 * bs, 8 * bs, 64]),
                  max_context_tokens=rng.choice([100_000, 100_000, 100_000, usable * bs // 2]),
                  resolve_deadline_s=rng.choice([15.0, 1.0, 0.25]),
                  flush_deadline_s=rng.choice([5.0, 0.5]),
                  teardown_at=round(rng.uniform(0, 0.4), 4) if rng.random() < 0.2 else None)
    vocab = 1000
    families = [[rng.randrange(vocab - 1) for _ in range(usable * bs)] for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.6:
        for fam in rng.sample(families, rng.randint(1, len(families))):
            sc.seeded_prefixes.append(fam[:bs * rng.randint(1, max(1, usable // 2))])
    t_cluster = rng.choice([0.0, 0.0, 0.05])
    for _ in range(rng.randint(1, 6)):
        fam = rng.choice(families)
        shared = rng.randint(0, len(fam) // 2)
        prompt = fam[:shared] + [rng.randrange(vocab - 1) for _ in range(rng.randint(1, 3 * bs))]
        target_pages = rng.randint(1, usable + 2)
        max_tokens = max(1, target_pages * bs - len(prompt))
        if role == "prefill" and rng.random() < 0.8:
            max_tokens = 1  # what a P/D router sends a prefill server
        lora = None
        if lora_control and rng.random() < 0.5:
            lora = rng.choice(["A", "A", "B"])
        t = t_cluster if rng.random() < 0.5 else round(rng.uniform(0, 0.3), 4)
        cancel = round(t + rng.uniform(0, 0.3), 4) if rng.random() < 0.15 else None
        echo = rng.random() < 0.15
        if echo and rng.random() < 0.8:
            prompt = prompt[:sc.max_prefill_tokens]  # an echo prompt must fit one step
        sc.requests.append(ReqSpec(t, prompt, max_tokens, lora, cancel, echo, echo and rng.random() < 0.7))
    if lora_control:
        for _ in range(rng.randint(0, 3)):
            op = rng.choice(["unload", "load", "list"])
            sc.controls.append(ControlSpec(round(rng.uniform(0, 0.3), 4), op, None if op == "list" else "A"))
    for port, kinds in PORT_KINDS.items():
        if rng.random() < 0.3:
            start = round(rng.uniform(0, 0.2), 4)
            length = rng.uniform(0.01, 3.0) if rng.random() < 0.9 else rng.uniform(3.0, 20.0)
            sc.faults.append(FaultSpec(port, rng.choice(kinds), start_s=start,
                                       heal_s=round(start + length, 4),
                                       probability=rng.choice([1.0, 0.5, 0.2] if port == "step" else [1.0, 1.0, 0.5]),
                                       delay_s=round(rng.uniform(0.001, 0.2), 4),
                                       match=rng.choice(["", "prefill", "decode", "unified"]) if port == "step" else ""))
    return sc
