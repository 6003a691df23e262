"""XLA's own HLO parser (jaxlib's `hlo_module_from_text`) against shardscope's reader, on the test corpus.

For each module of tests/hlo_samples: does XLA's parser take the text as it is; do the reader's counts
equal the expected ones (derived by tests/hlo_samples/oracle.py); CPU seconds of each. Then what each does
with a newer compiler's attribute and opcode, and with a file cut short. Every figure of one run sits
next to the other reader's, measured in the same process.

Usage: python benchmarks/hlo_parsers.py
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "tests" / "hlo_samples"
sys.path[:0] = [str(ROOT), str(SAMPLES)]


def seconds(fn, repeats: int = 3) -> float:
    """Best CPU seconds of `repeats` calls."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def xla_reads(text: str) -> str:
    """'yes', or XLA's first line of refusal."""
    import jax
    from jax._src.lib import xla_client

    try:
        xla_client.hlo.hlo_module_from_text(text)
    except jax.errors.JaxRuntimeError as err:
        lines = str(err).splitlines()
        return (lines[1] if len(lines) > 1 else lines[0]).removeprefix("was parsing ")[:90]
    return "yes"


def counts(rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    out: Counter[tuple[Any, ...]] = Counter()
    for r in rows:
        axes = None if r["axes"] is None else tuple(r["axes"])
        groups = r["groups"] if axes is None else None
        out[(r["op"], axes, groups, r["shift"], r["bytes"], r["loop_trips"])] += r["count"]
    return out


def main() -> None:
    import jax
    from jax._src.lib import xla_client
    from oracle import expected

    from shardscope.hlo import HloParseError, MeshLayout, parse_collectives

    jax.config.update("jax_platforms", "cpu")
    corpus = json.loads((SAMPLES / "corpus.json").read_text())["modules"]
    agree = xla_as_is = 0
    total_bytes = reader_s = xla_s = oracle_s = 0.0
    print(f"{'module':40} {'XLA parses it as is':60} reader agrees")
    for entry in corpus:
        text = (SAMPLES / entry["file"]).read_text()
        mesh = [tuple(a) for a in entry["mesh"]]
        layout = MeshLayout(tuple(a for a, _ in mesh), tuple(s for _, s in mesh))
        want = json.loads((SAMPLES / "expected" / f"{entry['file']}.json").read_text())
        parsed = parse_collectives(text, layout)
        ok = counts([c.to_dict() for c in parsed.collectives]) == counts(want["rows"])
        ok = ok and dict(Counter(u.op for u in parsed.unknown)) == want["unknown"]
        verdict = xla_reads(text)
        agree += ok
        xla_as_is += verdict == "yes"
        print(f"{entry['file']:40} {verdict[:60]:60} {'yes' if ok else 'NO'}")
        if verdict == "yes":
            total_bytes += len(text)
            reader_s += seconds(lambda text=text, layout=layout: parse_collectives(text, layout))
            xla_s += seconds(lambda text=text: xla_client.hlo.hlo_module_from_text(text))
            oracle_s += seconds(lambda text=text, mesh=mesh: expected(text, mesh), 1)
    mb = total_bytes / 2**20
    print(f"\nreader agrees with the expected counts on {agree} of {len(corpus)} modules as they are;")
    print(f"XLA's parser takes {xla_as_is} of {len(corpus)} as they are (the others need the text changed first)")
    print(f"on the {mb:.1f} MB XLA takes:  reader (collectives table) {reader_s:.3f} s = {mb / reader_s:.1f} MB/s")
    print(f"  XLA's parser alone (module object, nothing counted)   {xla_s:.3f} s = {mb / xla_s:.1f} MB/s")
    print(f"  XLA's parser + a count from its instructions (oracle) {oracle_s:.3f} s = {mb / oracle_s:.1f} MB/s")

    base = (SAMPLES / "cpu_scan_collectives.hlo.txt").read_text()
    layout = MeshLayout(("fsdp", "expert"), (4, 2))
    variants = {
        "a newer attribute on an all-gather": re.sub(r"( all-gather\(.*)", r"\1, future_attribute=true", base, count=1),
        "a newer opcode (all-gather-v2)": base.replace(" all-gather(", " all-gather-v2(", 1),
        "cut in the middle (half the text)": base[: len(base) // 2],
    }
    print()
    for label, text in variants.items():
        try:
            parsed = parse_collectives(text, layout)
            said = f"{sum(c.count for c in parsed.collectives)} collectives, {len(parsed.unknown)} unknown"
            said += f", {len(parsed.notices)} notice(s)"
        except HloParseError as err:
            said = f"fails: {err}"
        print(f"{label:36} XLA: {xla_reads(text)[:60]:60}  reader: {said}")


if __name__ == "__main__":
    main()
