"""`python -m bench.cel_conformance` (`make conformance`): CEL's own conformance suite through `improve`.

The CEL project publishes its conformance tests as data; the npm package `@bufbuild/cel-spec` carries
them (its `dist/cjs/testdata/conformance.js`, generated from cel-spec's `tests/simple/testdata`). This
script downloads that package at run time (the npm registry is the one source every machine of the
project reaches), keeps the cases without bindings, containers or type environments, runs every case
the expression layer's allowlist accepts through both evaluation paths (the fast path of
`improve/machine/fastcel/` and the `cel` package behind `Expr.evaluate`), and prints per section how
many were accepted, refused, passed and failed, as JSON on stdout.

It exits 1 on any deviation inside the subset docs/contracts.md declares supported: a case whose
expression the fast path covers (`compile_fast` is not None) that either path gets wrong, or any case
on which the two paths disagree. Cases outside that subset are counted and reported, not enforced.
Then it replays every bundled environment's recorded threads through XState v5 with the JS host
(`bench/xstate_conformance.py`, under the key `xstate`; `--no-xstate` leaves it out) and exits 1 too
when any thread runs differently there. Not a test: tests make no network calls.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import io
import json
import math
import re
import sys
import tarfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from improve.errors import EvaluationError, ExpressionError
from improve.machine.expr import Expr, Scope, compile_expr

PACKAGE = "@bufbuild/cel-spec"
# Pinned so that the numbers in docs/contracts.md can be reproduced; `--version latest` for the newest.
VERSION = "0.6.1"
REGISTRY = "https://registry.npmjs.org"
MEMBER = "package/dist/cjs/testdata/conformance.js"
# Features a case may need that the expression layer has no way to provide.
ENVIRONMENT_KEYS = ("bindings", "container", "typeEnv")


# --- download and decode ---------------------------------------------------------------------------


def download(version: str) -> tuple[str, str]:
    """The conformance data of `PACKAGE` at `version`, as JavaScript source, and the version fetched."""
    with urllib.request.urlopen(f"{REGISTRY}/{PACKAGE.replace('/', '%2F')}", timeout=60) as resp:
        meta = json.load(resp)
    if version == "latest":
        version = meta["dist-tags"]["latest"]
    dist = meta["versions"][version]["dist"]
    with urllib.request.urlopen(dist["tarball"], timeout=120) as resp:
        blob = resp.read()
    algo, _, digest = dist["integrity"].partition("-")
    if base64.b64encode(hashlib.new(algo, blob).digest()).decode() != digest:
        raise SystemExit(f"error: {PACKAGE}@{version}: the tarball does not match its integrity hash")
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        member = tar.extractfile(MEMBER)
        if member is None:
            raise SystemExit(f"error: {PACKAGE}@{version} has no {MEMBER}")
        return member.read().decode("utf-8"), version


_JS_TOKEN = re.compile(
    r"""
    (?P<space>\s+|//[^\n]*|/\*.*?\*/)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`(?:\\.|[^`\\])*`)
  | (?P<number>-?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|Infinity|NaN))
  | (?P<ident>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<punct>[{}\[\]:,])
    """,
    re.VERBOSE | re.DOTALL,
)


def _js_string(text: str) -> str:
    """A JavaScript string literal's value (the generator emits JSON-style escapes, in ' or ")."""
    body = text[1:-1]
    if text[0] == '"':
        return str(json.loads(text))
    body = re.sub(r'(?<!\\)((?:\\\\)*)"', r'\1\\"', body.replace("\\'", "'"))
    return str(json.loads(f'"{body}"'))


def parse_js_object(source: str) -> Any:
    """The object literal assigned to `exports.tests` in the generated module, as Python values."""
    start = source.index("{", source.index("exports.tests ="))
    tokens: Iterator[re.Match[str]] = (m for m in _JS_TOKEN.finditer(source, start) if m.lastgroup != "space")

    def value(tok: re.Match[str]) -> Any:
        kind, text = tok.lastgroup, tok.group()
        if text == "{":
            out: dict[str, Any] = {}
            while True:
                key = next(tokens)
                if key.group() == "}":
                    return out
                if key.group() == ",":
                    continue
                name = _js_string(key.group()) if key.lastgroup == "string" else key.group()
                colon = next(tokens)
                assert colon.group() == ":", f"expected ':' at {colon.start()}"
                out[name] = value(next(tokens))
        if text == "[":
            items: list[Any] = []
            while True:
                nxt = next(tokens)
                if nxt.group() == "]":
                    return items
                if nxt.group() == ",":
                    continue
                items.append(value(nxt))
        if kind == "string":
            return _js_string(text)
        if kind == "number":
            return float(text) if text.lstrip("-") in ("Infinity", "NaN") else json.loads(text)
        if text in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[text]
        raise ValueError(f"unexpected token {text!r} at {tok.start()}")

    return value(next(tokens))


# --- cases ----------------------------------------------------------------------------------------


class Unrepresentable(Exception):
    """An expected value with no Python counterpart here (a message, an enum, a type)."""


@dataclass(frozen=True, slots=True)
class Case:
    section: str
    name: str
    expr: str
    expect_error: bool
    value: Any = None
    unrepresentable: str = ""


def expected(v: dict[str, Any]) -> Any:
    """A conformance `Value` as the Python value the expression layer returns for it."""
    if "int64Value" in v:
        return int(v["int64Value"])
    if "uint64Value" in v:
        return int(v["uint64Value"])  # `cel` returns a uint as a Python int
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "stringValue" in v:
        return v["stringValue"]
    if "bytesValue" in v:
        return base64.b64decode(v["bytesValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "nullValue" in v:
        return None
    if "listValue" in v:
        return [expected(x) for x in v["listValue"].get("values", [])]
    if "mapValue" in v:
        out = {}
        for entry in v["mapValue"].get("entries", []):
            out[expected(entry["key"])] = expected(entry["value"])
        return out
    raise Unrepresentable(next(iter(v), "empty"))


def cases(tree: dict[str, Any]) -> tuple[list[Case], int]:
    """The cases without bindings, containers or type environments, and how many were left out."""
    kept: list[Case] = []
    skipped = 0
    for suite in tree["suites"]:
        for section in suite.get("suites", []):
            for test in section["tests"]:
                t = test["original"]
                if any(t.get(k) for k in ENVIRONMENT_KEYS) or t.get("checkOnly"):
                    skipped += 1
                    continue
                label = suite["name"]  # a file of cel-spec's tests/simple/testdata
                if "evalError" in t or "anyEvalErrors" in t:
                    kept.append(Case(label, f"{section['name']}/{t['name']}", t["expr"], True))
                    continue
                value = t.get("value", {"boolValue": True})  # no expectation means `true`
                if "typedResult" in t:
                    value = t["typedResult"].get("result")
                try:
                    kept.append(
                        Case(label, f"{section['name']}/{t['name']}", t["expr"], False, expected(value))
                    )
                except Unrepresentable as err:
                    kept.append(
                        Case(
                            label,
                            f"{section['name']}/{t['name']}",
                            t["expr"],
                            False,
                            unrepresentable=str(err),
                        )
                    )
    return kept, skipped


# --- running --------------------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Equal values of the same kind (a bool is not an int, an int not a float); NaN is NaN."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        if len(a) != len(b):
            return False
        for k, x in a.items():
            match = [j for j in b if same(j, k)]
            if not match or not same(x, b[match[0]]):
                return False
        return True
    return bool(a == b)


Outcome = tuple[str, Any]


def run(expr: Expr) -> Outcome:
    try:
        return ("ok", expr.evaluate(Scope()))
    except EvaluationError as err:
        return ("error", str(err))


def verdict(case: Case, got: Outcome) -> bool:
    if case.expect_error:
        return got[0] == "error"
    if case.unrepresentable:
        return False
    return got[0] == "ok" and same(got[1], case.value)


@dataclass
class Tally:
    accepted: int = 0
    refused: int = 0
    passed: int = 0
    failed: int = 0
    fast_covered: int = 0
    failures: list[str] = field(default_factory=list)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cel_conformance", description=__doc__)
    parser.add_argument("--version", default=VERSION, help=f"{PACKAGE} version (default {VERSION})")
    parser.add_argument("--failures", action="store_true", help="list every failing case on stderr")
    parser.add_argument(
        "--no-xstate", action="store_true", help="skip the XState check (bench/xstate_conformance.py)"
    )
    args = parser.parse_args()
    print(f"conformance: downloading {PACKAGE}@{args.version} ...", file=sys.stderr)
    source, version = download(args.version)
    selected, skipped = cases(parse_js_object(source))
    sections: dict[str, Tally] = {}
    deviations: list[str] = []
    for case in selected:
        tally = sections.setdefault(case.section, Tally())
        try:
            expr = compile_expr(case.expr, case.name)
        except ExpressionError:
            tally.refused += 1
            continue
        tally.accepted += 1
        slow = run(dataclasses.replace(expr, fast=None))  # the `cel` package, through the wrapper
        ok = verdict(case, slow)
        covered = expr.fast is not None
        label = f"{case.section}/{case.name}: `{case.expr}`"
        if covered:
            tally.fast_covered += 1
            fast = run(expr)  # the fast path (or cel, where it falls back)
            if verdict(case, fast) != ok or fast[0] != slow[0]:
                deviations.append(f"{label}: the paths disagree: fast {fast!r}, cel {slow!r}")
            ok = ok and verdict(case, fast)
        if ok:
            tally.passed += 1
        else:
            tally.failed += 1
            want = "an error" if case.expect_error else case.unrepresentable or repr(case.value)
            tally.failures.append(f"{label}: expected {want}, got {slow!r}")
            if covered:
                deviations.append(f"{label}: expected {want}, got {slow!r} (inside the fast subset)")
    total = Tally()
    for t in sections.values():
        total.accepted += t.accepted
        total.refused += t.refused
        total.passed += t.passed
        total.failed += t.failed
        total.fast_covered += t.fast_covered
    report = {
        "package": f"{PACKAGE}@{version}",
        "cases": len(selected),
        "left_out_needing_an_environment": skipped,
        "total": {k: v for k, v in dataclasses.asdict(total).items() if k != "failures"},
        "deviations_in_supported_subset": len(deviations),
        "sections": {
            name: {k: v for k, v in dataclasses.asdict(t).items() if k != "failures"}
            for name, t in sorted(sections.items())
        },
    }
    if not args.no_xstate:
        # The exported machines run in XState v5 through the JS host, thread by thread.
        from bench.xstate_conformance import xstate_conformance

        report["xstate"] = xstate_conformance()
    print(json.dumps(report, indent=2))
    if args.failures:
        for t in sections.values():
            for line in t.failures:
                print(f"fail: {line}", file=sys.stderr)
    for line in deviations:
        print(f"deviation: {line}", file=sys.stderr)
    xstate = report.get("xstate")
    differing = 0
    if isinstance(xstate, dict):
        differing = xstate.get("differing", 0) + xstate.get("explored_paths", {}).get("differing", 0)
    for line in xstate.get("first_differences", []) if isinstance(xstate, dict) else []:
        print(f"xstate: {line}", file=sys.stderr)
    if deviations or differing:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
