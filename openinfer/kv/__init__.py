"""The kv-store: block pool, per-request KV, tiers, and the KvStore that resolves,
seals, retires and flushes (spec §2–§4)."""

from openinfer.kv.config import StoreConfig
from openinfer.kv.flush import FlushOutcome
from openinfer.kv.hashing import BASE_SALT, BlockHash, block_hashes, salt_hash
from openinfer.kv.host_tier import HostTier
from openinfer.kv.metaserver import MetaServer, PeerDirectory
from openinfer.kv.peer_tier import PeerTier
from openinfer.kv.pool import BlockPool, PageRefs
from openinfer.kv.ports import Gate, Ports
from openinfer.kv.prefix import CacheScope, CancelProbe, KvPrefix, NeverCancelled, ResolvePolicy
from openinfer.kv.probe import PrefixProbe, Reservation, probe_prefix
from openinfer.kv.request_kv import RequestKv
from openinfer.kv.saves import SaveClass, SaveCursor
from openinfer.kv.stats import DegradeReason, StoreStats
from openinfer.kv.store import KvStore, Rank

__all__ = [
    "BASE_SALT", "BlockHash", "BlockPool", "CacheScope", "CancelProbe", "DegradeReason",
    "FlushOutcome", "Gate", "HostTier", "KvPrefix", "KvStore", "MetaServer", "NeverCancelled",
    "PageRefs", "PeerDirectory", "PeerTier", "Ports", "PrefixProbe", "Rank", "RequestKv",
    "Reservation", "ResolvePolicy", "SaveClass", "SaveCursor", "StoreConfig", "StoreStats",
    "block_hashes", "probe_prefix", "salt_hash",
]
