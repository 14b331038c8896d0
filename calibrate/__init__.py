"""Calibration runs (the real engines, micro-benchmarks) that write measurements to data/, in three
rooms: harness/ (the `python -m calibrate` command, launching, recording, fitting), benches/
(micro-benchmarks) and engines/ (the real engines' cases and workers); docs/calibration.md says
what goes where.

Heavy imports (torch, deepspeed, scipy.optimize) belong here, never in planner/.
"""
