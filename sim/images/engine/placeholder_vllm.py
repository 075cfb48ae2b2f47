#!/usr/bin/python3
"""Placeholder used only while sim/engine/standin_vllm.py does not exist yet:
answers --help and refuses to serve."""
import sys

if any(a in ("-h", "--help") for a in sys.argv[1:]):
    print("usage: vllm serve [model_tag] [options]  (sparkfleet sim placeholder)")
    sys.exit(0)
sys.stderr.write("sparkfleet sim: the stand-in vLLM engine is not built into this image yet\n")
sys.exit(1)
