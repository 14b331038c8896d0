"""Fuzz the command line at length: `python benchmarks/fuzz.py [N]` (default 10,000 inputs).

Runs the generator and property of tests/test_fuzz.py (no pytest needed) over N inputs and prints
how many ended with exit 0 and exit 2, every violation by kind with its first reproducer, and the
slowest call. Exits 1 when any input broke the property.
"""

from __future__ import annotations

import collections
import importlib.util
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def load_generator():
    """tests/test_fuzz.py as a module (it imports without pytest)."""
    spec = importlib.util.spec_from_file_location("planner_fuzz", ROOT / "tests" / "test_fuzz.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    n = int(argv[0]) if argv else 10_000
    F = load_generator()
    F.CHECK_WALL_CLOCK = True  # speed is this benchmark's to judge, not the tests'
    codes = collections.Counter()
    kinds = collections.Counter()
    first = {}
    examples = collections.defaultdict(list)
    sources = collections.Counter()
    slowest = [0.0, None]
    start = time.perf_counter()

    # a hypothesis test run directly: generation only, no shrinking, nothing stored, reproducible
    @settings(max_examples=n, deadline=None, derandomize=True, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(F.cases())
    def one(spec):
        o = F.run_case(spec)
        codes[o.code if not o.error else "exception"] += 1
        if o.elapsed > slowest[0]:
            slowest[:] = [o.elapsed, o.argv]
        for kind in {k for k, _ in o.violations}:
            kinds[kind] += 1
            first.setdefault(kind, F.describe(o))
            if len(examples[kind]) < 5:
                examples[kind].append(f"{o.elapsed:.1f} s {o.spec!r}")
        if o.error:
            sources[F.where(o)] += 1
        total = sum(codes.values())
        if total % 1000 == 0:
            print(f"... {total} inputs, {sum(kinds.values())} violations, {time.perf_counter() - start:.0f} s",
                  file=sys.stderr, flush=True)

    one()
    total = sum(codes.values())
    print(f"total: {total} inputs in {time.perf_counter() - start:.1f} s")
    print(f"exit 0: {codes[0]}")
    print(f"exit 2: {codes[2]}")
    other = {k: v for k, v in codes.items() if k not in (0, 2)}
    if other:
        print(f"other outcomes: {other}")
    print("violations by kind (inputs with at least one):")
    for kind in F.KINDS:
        print(f"  {kind}: {kinds[kind]}")
    if sources:
        print("exceptions by innermost planner frame:")
        for place, count in sources.most_common():
            print(f"  {place}: {count}")
    print(f"slowest call: {slowest[0]:.3f} s: {slowest[1]!r}")
    for kind, text in first.items():
        print(f"\nfirst {kind}:\n{text}")
        print(f"up to 5 {kind} inputs (as drawn):")
        for line in examples[kind]:
            print("  " + line)
    return 1 if kinds else 0


if __name__ == "__main__":
    sys.exit(main())
