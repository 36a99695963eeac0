"""Time one policy-rule evaluation with leviathd's own CEL subset and, when
installed (in a scratch venv, not the project's), the two CEL packages from
PyPI: `common-expression-language` (module `cel`, Rust) and `cel-python`
(module `celpy`, pure Python). Prints the median and p99 per evaluation.

    python3 bench/cel_bench.py [N]
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from leviathd.policy.cel import compile_expr

EXPR = ('call.tool == "http_get" && rank(taint) >= rank("private") '
        '&& !call.target.startsWith("https://internal.example/")')
EXPR_PKG = EXPR.replace('rank(taint) >= rank("private")', 'taint == "private"')
ENV: dict[str, Any] = {
    "call": {"tool": "http_get", "target": "https://example.org/x", "args": {"url": "x"}},
    "taint": "private",
    "agent": {"id": "a1", "user": "alice", "groups": ["alice", "dev"]},
}


def timeit(fn: Callable[[], object], n: int) -> tuple[float, float]:
    for _ in range(min(n, 1000)):
        fn()
    samples = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t)
    samples.sort()
    return statistics.median(samples) / 1000, samples[int(len(samples) * 0.99)] / 1000


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    prog = compile_expr(EXPR)
    assert prog.evaluate(ENV) is True
    rows = [("leviathd.policy.cel (own subset)", timeit(lambda: prog.evaluate(ENV), n))]
    try:
        import cel  # type: ignore[import-not-found]

        rp = cel.compile(EXPR_PKG)
        assert rp.execute(ENV) is True
        rows.append(("common-expression-language", timeit(lambda: rp.execute(ENV), n)))
    except ImportError:
        rows.append(("common-expression-language", (float("nan"), float("nan"))))
    try:
        import celpy  # type: ignore[import-not-found]

        env = celpy.Environment()
        pp = env.program(env.compile(EXPR_PKG))
        act = {k: celpy.json_to_cel(v) for k, v in ENV.items()}
        assert bool(pp.evaluate(act)) is True
        rows.append(("cel-python", timeit(lambda: pp.evaluate(act), max(n // 10, 100))))
    except ImportError:
        rows.append(("cel-python", (float("nan"), float("nan"))))
    for name, (med, p99) in rows:
        print(f"{name:34} median {med:8.1f} µs  p99 {p99:8.1f} µs")


if __name__ == "__main__":
    main()
