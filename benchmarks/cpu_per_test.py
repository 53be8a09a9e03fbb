"""CPU seconds of each test: a pytest plugin for finding what makes the suite slow on a
machine that others share.

`--durations` reports wall time, which a loaded machine inflates by the load (several times
at a load of 10 on 2 cores, and unevenly). The CPU time a test costs, this process's (all
its threads) and that of the subprocesses it waited for, changes far less with the load,
and is about what the test takes on an idle machine where its process is the only busy one
(TensorFlow's tests here run mostly on one thread; JAX compiles on several, so its tests
may take less wall time than CPU time).

Example:

```
python -m pytest -p benchmarks.cpu_per_test tests/test_export_litert.py
```

prints the CPU seconds of each test function (its parametrizations summed), the most costly
tests with their wall time beside, and how the process's CPU time splits between its main
thread and the others. `POSENC_TEST_CPU=FILE` also writes every test's `cpu wall nodeid`
to FILE. A module-scoped fixture is charged to the first test that uses it.
"""

from __future__ import annotations

import collections
import os
import resource
import time

import pytest

SHOWN = 25

_measured: list[tuple[str, float, float]] = []


def _cpu_seconds() -> float:
    """User and system seconds of this process and of the children it waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _thread_seconds() -> tuple[float, float]:
    """`(main thread, all live threads)` CPU seconds of this process (Linux's /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    main = everything = 0.0
    for thread in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{thread}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        seconds = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        everything += seconds
        if int(thread) == os.getpid():
            main = seconds
    return main, everything


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = _cpu_seconds(), time.perf_counter()
    yield
    _measured.append((item.nodeid, _cpu_seconds() - cpu, time.perf_counter() - wall))


def pytest_terminal_summary(terminalreporter) -> None:
    write = terminalreporter.write_line
    total = sum(cpu for _, cpu, _ in _measured)
    write(f"CPU seconds of {len(_measured)} tests: {total:.1f}")
    by_function = collections.defaultdict(float)
    for nodeid, cpu, _ in _measured:
        by_function[nodeid.split("[")[0]] += cpu
    for name, cpu in sorted(by_function.items(), key=lambda item: -item[1])[:SHOWN]:
        write(f"{cpu:8.1f} s CPU  {name}")
    for nodeid, cpu, wall in sorted(_measured, key=lambda item: -item[1])[:SHOWN]:
        write(f"{cpu:8.1f} s CPU {wall:8.1f} s wall  {nodeid}")
    main, threads = _thread_seconds()
    write(f"this process: main thread {main:.1f} s CPU, all its live threads {threads:.1f} s")
    path = os.environ.get("POSENC_TEST_CPU")
    if path:
        with open(path, "w") as out:
            out.writelines(f"{cpu:.3f}\t{wall:.3f}\t{nodeid}\n" for nodeid, cpu, wall in _measured)
