"""ampbench: what does automatic mixed precision buy us? FP32 against AMP, on Kubeflow."""

import os
from importlib.metadata import PackageNotFoundError, version

# The profiler's library (kineto) reads its log level once, as torch loads: without this its
# warnings and errors (a failed GPU count on a CPU) land among ampbench's lines.
os.environ.setdefault("KINETO_LOG_LEVEL", "5")

try:
    __version__ = version("ampbench")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

PIPELINE_NAME = "ampbench"
# The one place the component image is named; `ampbench compile --image` overrides it.
DEFAULT_IMAGE = f"ghcr.io/ampbench/ampbench:{__version__}"
