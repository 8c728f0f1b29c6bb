"""Summarise pytest JUnit XML files into one JSON record (committed as data after a GPU run)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET


def summarise(path: str) -> dict:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "time_s": 0.0}
    failed = []
    for suite in suites:
        for key in ("tests", "failures", "errors", "skipped"):
            totals[key] += int(suite.get(key, 0))
        totals["time_s"] += float(suite.get("time", 0.0))
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed.append(f"{case.get('classname')}::{case.get('name')}")
    totals["passed"] = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
    totals["failed_tests"] = failed
    return totals


if __name__ == "__main__":
    out = {p.rsplit("/", 1)[-1].removesuffix(".xml"): summarise(p) for p in sys.argv[2:]}
    out["context"] = json.loads(sys.argv[1])
    print(json.dumps(out, indent=1))
