"""The SimPy world: models of the GPU, copy engines, tiers, peers and the MetaServer that
the unchanged scheduler and KvStore run against in virtual time."""
