"""`python3 -m sglang.launch_server ...` in the sim's SGLang image: the vLLM stand-in in its SGLang mode."""
import sys

sys.path.insert(0, "/opt/standin")

from standin_vllm import main  # noqa: E402  (next to it in the image: /opt/standin)

if __name__ == "__main__":
    sys.exit(main(["--mode", "sglang", "--flags-file", "/opt/standin/sglang-flags.json", *sys.argv[1:]]))
