"""planner: memory and step-time planner for distributed LLM training.

Pure numpy. Importing this package never imports torch, deepspeed, streamlit or scipy.optimize.
"""

from planner.errors import InputError
from planner.model import ModelSpec

__all__ = ["InputError", "ModelSpec"]
__version__ = "0.1.0"
