"""kvmem's benchmark suite: `python -m tests.bench [--quick] [--out DIR]`.

Not collected by pytest (no `test_*` files here); `tests/test_bench.py` runs it once in quick
mode to prove it still works.
"""
