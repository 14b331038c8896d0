"""Calibration runs (DeepSpeed, PyTorch TP/PP, micro-benchmarks) that write measurements to data/.

Filled by a later issue; heavy imports (torch, deepspeed, scipy.optimize) belong here, never in planner/.
"""
