"""Benchmarks of vecsched: ``python -m benchmarks [--quick]``.

Times every stage of :func:`vecsched.estimate` on the synthetic hordes of
:mod:`vecsched.synthetic`, side by side with three baselines measured in the
same process (the per-request scalar path of :mod:`vecsched.reference`, a plain
dense NumPy version in :mod:`benchmarks.dense`, and the one-pass floor of
:mod:`benchmarks.floor`), and writes ``benchmarks/results/<mode>.json``, a PNG
plot and the table in ``benchmarks/README.md``.
"""
