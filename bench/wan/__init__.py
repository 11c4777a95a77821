"""The WAN head-to-head: `python -m bench.wan ...` (see `__main__`)."""
