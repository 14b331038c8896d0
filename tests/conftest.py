"""Hypothesis runs derandomized by default, so a CI run is reproducible (a property test drew a new
counterexample in one CI run out of many: tests/test_memory.py, ZeRO-2 under DeepSpeed's pipeline
engine, which DeepSpeed refuses). Explore with HYPOTHESIS_PROFILE=explore, or benchmarks/fuzz.py."""

import atexit
import os
import shutil
import tempfile

from hypothesis import settings

# A profile name finds the user's profile before the shipped one (planner/calibration.py user_dir):
# tests read the shipped ones, whatever the developer has calibrated, and write none of theirs.
os.environ["PLANNER_HOME"] = tempfile.mkdtemp(prefix="planner-home-")
atexit.register(shutil.rmtree, os.environ["PLANNER_HOME"], True)

settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
