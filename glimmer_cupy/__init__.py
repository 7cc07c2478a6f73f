"""glimmer_cupy: fast LLM inference on NVIDIA GPUs from Python, with a NumPy reference path.

Importing this package needs no GPU and no driver; CUDA is touched at the first GPU call.
"""

__version__ = "0.1.0"
