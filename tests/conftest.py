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

# Each pytest-xdist worker (-n auto: one a core, at most 4) computes with its share of the cores, as the
# ranks it launches do (one thread each: calibrate/harness/launch.py). With torch's default pool, a
# thread a core in every worker, 2 workers on a 2-core CI machine oversubscribed it and OpenMP's
# waiting threads spun: in-process tests took twice as long beside busy processes
# (tests/test_activations_deepseek.py 31 s against 16 s with one thread; the same 10 s on idle cores).
# Set before torch is imported; a value the user set stands.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, _threads)

settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))
