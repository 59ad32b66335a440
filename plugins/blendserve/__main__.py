"""``python -m blendserve``: the command line."""

from blendserve.cli import entry

if __name__ == "__main__":  # vLLM spawns workers that re-import __main__
    entry()
