"""The main job. For now: the store's round-trip demo (``experiments.store_demo``)."""

from experiments.store_demo import main

if __name__ == "__main__":
    main()
