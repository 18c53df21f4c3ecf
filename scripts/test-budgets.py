#!/usr/bin/env python3
"""Test budgets (scripts/test-budgets.toml) for nextest, and the report of a run.

  test-budgets.py config STORE [--soak]
                                    nextest's config, with a slow-timeout per binary
                                    and its store (JUnit report) in STORE
  test-budgets.py report JUNIT      `binary  budget: B s, took: T s` per binary, then
                                    `tests: N passed, M failed`; exits 1 when a binary
                                    went over its budget
"""
import json
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

BUDGETS = tomllib.loads((Path(__file__).parent / "test-budgets.toml").read_text())
PERIOD = 10  # nextest reports a slow test each period and kills it after budget/period of them


def budget(binary: str, soak: bool = False) -> int:
    seconds = BUDGETS["binary"].get(binary, BUDGETS["default"])
    return seconds * (BUDGETS["soak"] if soak else 1)


def config(store: str, soak: bool) -> str:
    def timeout(seconds: int) -> str:
        return f'{{ period = "{PERIOD}s", terminate-after = {max(1, seconds // PERIOD)} }}'

    lines = [
        "[store]",
        f"dir = {json.dumps(store)}",
        "",
        "[profile.default]",
        "test-threads = 2",
        "fail-fast = false",
        'status-level = "pass"',
        'final-status-level = "slow"',
        f"slow-timeout = {timeout(budget('', soak))}",
        "",
        "[profile.default.junit]",
        'path = "junit.xml"',
    ]
    def override(tests: str, *settings: str) -> list[str]:
        return ["", "[[profile.default.overrides]]", f"filter = {json.dumps(tests)}", *settings]

    serial = BUDGETS.get("serial", [])
    if serial:
        lines += ["", "[test-groups]", "serial = { max-threads = 1 }"]
    for tests in serial:
        lines += override(tests, 'test-group = "serial"', "priority = 100")
    for tests in BUDGETS.get("first", []):
        lines += override(tests, "priority = 50")
    for binary in sorted(BUDGETS["binary"]):
        lines += override(f"binary_id({binary})", f"slow-timeout = {timeout(budget(binary, soak))}")
    return "\n".join(lines) + "\n"


def report(junit: str, soak: bool) -> int:
    took: dict[str, list[float]] = {}
    failed = 0
    for case in ET.parse(junit).getroot().iter("testcase"):
        binary = case.get("classname", "?")
        took.setdefault(binary, []).append(float(case.get("time", "0")))
        failed += case.find("failure") is not None or case.find("error") is not None
    over = 0
    width = max(map(len, took), default=0)
    for binary in sorted(took):
        times = took[binary]
        b = budget(binary, soak)
        flag = "" if max(times) <= b else "  OVER BUDGET"
        over += bool(flag)
        print(
            f"{binary:<{width}}  budget: {b} s, took: {max(times):.0f} s"
            f"  ({len(times)} tests, {sum(times):.0f} s in all){flag}"
        )
    cases = sum(map(len, took.values()))
    print(f"tests: {cases - failed} passed, {failed} failed")
    return 1 if over else 0


if __name__ == "__main__":
    soak = "--soak" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--soak"]
    if args[:1] == ["config"] and len(args) == 2:
        sys.stdout.write(config(args[1], soak))
    elif args[:1] == ["report"] and len(args) == 2:
        sys.exit(report(args[1], soak))
    else:
        sys.exit(__doc__)
