#!/usr/bin/env python3
"""A skip is a failure unless it is expected: after `ctest --output-junit FILE`, every test that
did not run (exit 77 = SKIP_RETURN_CODE, or any other "not run") must carry the `gpu` label or be
named in tests/skip-allowlist.txt with its reason. `make test` runs this after each ctest, so a
test whose package setup.sh failed to install, or which found a phase it cannot run, fails CI
instead of passing as "did not run".

usage: check_skips.py BUILD_DIR JUNIT_XML   (labels come from `ctest --show-only=json-v1`)
"""
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

ALLOWLIST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "skip-allowlist.txt")


def allowlist():
    """test name -> reason; lines `name  reason`, # comments. A name without a reason is an
    error: the list exists to say why."""
    out = {}
    with open(ALLOWLIST) as f:
        for n, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, _, reason = line.partition(" ")
            if not reason.strip():
                raise SystemExit(f"{ALLOWLIST}:{n}: {name} has no reason")
            out[name] = reason.strip()
    return out


def labels(build):
    r = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, capture_output=True,
                       text=True, check=True)
    out = {}
    for t in json.loads(r.stdout)["tests"]:
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        out[t["name"]] = set(props.get("LABELS", []))
    return out


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    build, junit = sys.argv[1], sys.argv[2]
    allowed, lab = allowlist(), labels(build)
    bad, ok = [], []
    for tc in ET.parse(junit).getroot().iter("testcase"):
        if tc.get("status") == "run":
            continue
        name = tc.get("name")
        out = (tc.findtext("system-out") or "").strip().splitlines()
        why = next((ln for ln in out if "SKIP" in ln.upper()), out[-1] if out else "")
        if "gpu" in lab.get(name, ()):
            ok.append(f"{name} (label gpu): {why}")
        elif name in allowed:
            ok.append(f"{name} (allow-listed: {allowed[name]}): {why}")
        else:
            bad.append(f"{name}: {why}")
    for line in ok:
        print(f"check_skips: skipped as allowed: {line}")
    for line in bad:
        print(f"check_skips: FAIL: skipped outside the gpu label and {ALLOWLIST}: {line}")
    if bad:
        print(f"check_skips: {len(bad)} test(s) did not run; install what they name "
              "(scripts/setup.sh) or allow-list them with the reason")
        return 1
    print(f"check_skips: {build}: no unexpected skip ({len(ok)} allowed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
