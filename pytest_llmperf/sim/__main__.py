import sys

from pytest_llmperf.sim.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="python -m pytest_llmperf.sim"))
