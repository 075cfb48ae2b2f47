"""sparkfleet: provision DGX Sparks as verified vLLM servers with pyinfra."""

from pathlib import Path

__version__ = "0.1.0"

PROJECT_ROOT = Path(__file__).resolve().parent.parent
