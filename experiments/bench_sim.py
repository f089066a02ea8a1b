"""The old speed command, now an alias of ``experiments.bench`` (one implementation).

    python -m experiments.bench_sim [requests=10000] [small=1000] [repeats=3] [load=0.7] [report=PATH]

is ``python -m experiments.bench cases=chat sizes=SMALL,REQUESTS ...``: the chat case at two
sizes and its scaling ratio. ``model=`` / ``hardware=`` become ``world=model=...``; every
other key is passed through to ``experiments.bench`` and checked there.
"""

from __future__ import annotations

from experiments import bench
from experiments.cli import main_guard


def translate(argv: list[str]) -> list[str]:
    kv = dict(a.partition("=")[::2] for a in argv if "=" in a)
    rest = [a for a in argv if "=" not in a]  # left for bench to reject with its message
    small, full = kv.pop("small", "1000"), kv.pop("requests", "10000")
    sizes = full if small == full else f"{small},{full}"
    world = [f"{k}={kv.pop(k)}" for k in ("model", "hardware") if k in kv]
    if world:
        kv["world"] = ",".join(filter(None, [kv.get("world", ""), *world]))
    kv.setdefault("cases", "chat")
    kv.setdefault("sizes", sizes)
    return [f"{k}={v}" for k, v in kv.items()] + rest


def cli(argv: list[str]) -> None:
    bench.cli(translate(argv))


main = main_guard(cli)


if __name__ == "__main__":
    main()
