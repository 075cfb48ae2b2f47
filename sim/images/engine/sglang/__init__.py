"""The sim's stand-in SGLang: only `python3 -m sglang.launch_server` (launch_server.py) exists."""
