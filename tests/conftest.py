"""Hypothesis runs derandomized by default, so a CI run is reproducible (a property test drew a new
counterexample in one CI run out of many: tests/test_memory.py, ZeRO-2 under DeepSpeed's pipeline
engine, which DeepSpeed refuses). Explore with HYPOTHESIS_PROFILE=explore, or benchmarks/fuzz.py."""

import os

from hypothesis import settings

settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
