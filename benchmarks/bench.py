"""shardscope benchmark: what a dump costs beyond XLA's own compile, and the other speed targets.

Prints, in one run, measured values next to their targets:
  1. per tiny case: `dump` wall time vs a bare lower + compile + as_text of the same step (same process,
     same compiler options) — the ratio is the headline;
  2. the golden `check` of the CPU matrix from a cold process;
  3. HLO parsing throughput on the largest HLO of the matrix and on a synthetic 200 MB module, next to a
     plain line count of the same text (the floor) and XLA's own parser on the matrix HLO;
  4. a real-shape case (deepseek3-671b on cpu-256): wall time and peak RSS (a separate process);
  5. `shardscope --help` start-up time.

Usage: python benchmarks/bench.py [--quick]   (--quick skips the cold check and the real-shape case)
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent.parent
TINY_CASES = [
    (m, p) for m in ("deepseek-tiny", "mixtral-tiny") for p in ("default", "ep-as-cp", "ep-tp", "shard-exp-on-fsdp")
]
TARGETS = {
    "dump_ratio": 1.15,
    "check_seconds": 30.0,
    "parse_mb_per_s": 80.0,
    "real_seconds": 60.0,
    "real_gib": 6.0,
    "help_seconds": 0.5,
}


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def bare_compile_seconds(case) -> tuple[float, str]:
    """jit + lower + compile + as_text of the same step, shardings and compiler options; nothing else."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from reference_models.sharding import sharding_context
    from shardscope.compile import abstract_state, compiler_options_for, make_train_step, sharding_context_for
    from shardscope.topology import build_mesh

    mesh = build_mesh(case.topology, case.mesh, explicit=case.preset.shard_mode == "explicit")
    abstract = abstract_state(case, mesh)  # inputs are given to the baseline, not timed
    context = sharding_context_for(case, mesh)
    start = time.perf_counter()
    step = jax.jit(
        make_train_step(case),
        in_shardings=(abstract.state_shardings, abstract.batch_shardings),
        out_shardings=(abstract.state_shardings, {"loss": NamedSharding(mesh, PartitionSpec())}),
        donate_argnums=0,
    )
    with sharding_context(context), jax.set_mesh(mesh):
        lowered = step.lower(abstract.state, abstract.batch)
    text = lowered.compile(compiler_options=compiler_options_for(case)).as_text()
    return time.perf_counter() - start, text


def dump_seconds(case) -> float:
    """The whole dump pipeline after argument validation: plan + canonical JSON.

    The abstract-state cache is emptied first: a user's single `dump` pays for tracing the model's init,
    so the ratio does too (the baseline's untimed set-up would otherwise have warmed it).
    """
    from shardscope.compile import _abstract_train_state
    from shardscope.extract import plan_case
    from shardscope.plan import plan_to_json

    _abstract_train_state.cache_clear()
    start = time.perf_counter()
    plan_to_json(plan_case(case))
    return time.perf_counter() - start


def bench_dump_ratio(repeats: int) -> tuple[list[str], bool]:
    from shardscope.case import resolve_case
    from shardscope.topology import configure_cpu_devices

    configure_cpu_devices(8)
    lines = [f"{'case':34} {'dump s':>8} {'bare s':>8} {'ratio':>6}"]
    worst = 0.0
    resolve_case(*TINY_CASES[0])  # imports
    bare_compile_seconds(resolve_case(*TINY_CASES[0]))  # warm-up: first compile pays one-off costs
    for model, preset in TINY_CASES:
        case = resolve_case(model, preset)
        bares, dumps = [], []
        for _ in range(repeats):  # interleaved, so machine noise hits both sides alike
            bares.append(bare_compile_seconds(case)[0])
            dumps.append(dump_seconds(case))
        bare, dump = statistics.median(bares), statistics.median(dumps)
        worst = max(worst, dump / bare)
        lines.append(f"{model + '/' + preset:34} {dump:8.2f} {bare:8.2f} {dump / bare:6.2f}")
    ok = worst <= TARGETS["dump_ratio"]
    lines.append(f"worst ratio {worst:.2f} (target <= {TARGETS['dump_ratio']}): {verdict(ok)}")
    return lines, ok


def synthetic_hlo(text: str, size: int) -> str:
    """A module of about `size` bytes: the computations of `text` repeated under new names, then its entry."""
    head, _, entry = text.partition("\nENTRY ")
    header, _, computations = head.partition("\n\n")
    copies = [header]
    copy = 0
    while sum(map(len, copies)) < size:
        copy += 1
        copies.append(re.sub(r"%([\w.\-]+)", rf"%\1_r{copy}", computations))
    return "\n\n".join(copies) + "\nENTRY " + entry


def _best_seconds(fn, repeats: int = 3) -> float:
    """Best CPU seconds of `repeats` calls (CPU time: other processes on the machine do not count)."""
    timings = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        timings.append(time.process_time() - start)
    return min(timings)


def _xla_parse_seconds(text: str) -> str:
    """XLA's own HLO parser (bundled with jaxlib) on the same text, for comparison; or why it cannot."""
    import jax
    from jax._src.lib import xla_client

    try:
        seconds = _best_seconds(lambda: xla_client.hlo.hlo_module_from_text(text), 1)
    except jax.errors.JaxRuntimeError as err:  # XLA rejects the module: say so, next to the numbers
        return f"fails: {str(err).splitlines()[0][:80]}"
    return f"{seconds:6.3f} s  {len(text) / 2**20 / seconds:6.1f} MB/s"


def bench_parse() -> tuple[list[str], bool]:
    from shardscope.case import resolve_case
    from shardscope.hlo import MeshLayout, parse_collectives
    from shardscope.topology import configure_cpu_devices

    configure_cpu_devices(8)

    texts = {}
    for model, preset in TINY_CASES:
        case = resolve_case(model, preset)
        texts[(model, preset)] = (bare_compile_seconds(case)[1], case)
    (largest, case) = max(texts.values(), key=lambda item: len(item[0]))
    layout = MeshLayout(tuple(a for a, _ in case.mesh), tuple(s for _, s in case.mesh))
    lines, rates = [f"{'':22} {'size':>8}  {'shardscope':>22}  {'line count (floor)':>22}"], []
    for label, text in (("largest matrix HLO", largest), ("synthetic 200 MB", synthetic_hlo(largest, 200 * 2**20))):
        seconds = _best_seconds(lambda text=text: parse_collectives(text, layout))
        floor = _best_seconds(lambda text=text: text.count("\n"))
        size = len(text) / 2**20
        rate = size / seconds
        rates.append(rate)
        lines.append(
            f"{label:22} {size:5.1f} MB  {seconds:6.3f} s {rate:7.1f} MB/s  {floor:6.3f} s {size / floor:7.1f} MB/s"
        )
    lines.append(f"XLA's parser (jaxlib), largest matrix HLO: {_xla_parse_seconds(largest)}")
    ok = min(rates) >= TARGETS["parse_mb_per_s"]
    lines.append(f"slowest {min(rates):.1f} MB/s (target >= {TARGETS['parse_mb_per_s']}): {verdict(ok)}")
    return lines, ok


def run_timed(args: list[str]) -> tuple[float, float, int]:
    """Wall seconds, peak RSS (GiB) and exit code of a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    code = subprocess.run(args, cwd=ROOT, capture_output=True).returncode
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, max(peak, before) / 2**20, code


def cpu_golden_copy() -> Path:
    """The golden directory with only its CPU cases (the target is about the CPU matrix)."""
    import shutil
    import tempfile

    import yaml

    target = Path(tempfile.mkdtemp(prefix="shardscope-bench-")) / "golden"
    shutil.copytree(ROOT / "golden", target)
    manifest = yaml.safe_load((target / "cases.yaml").read_text())
    manifest["cases"] = [c for c in manifest["cases"] if c.get("topology", "cpu-8").startswith("cpu-")]
    (target / "cases.yaml").write_text(yaml.safe_dump(manifest))
    for plan in target.glob("*/*/*.json"):
        if not plan.parent.name.startswith("cpu-"):
            plan.unlink()
    return target


def bench_check() -> tuple[list[str], bool]:
    lines, ok = [], True
    cpu_only = cpu_golden_copy()
    cases = len(list(cpu_only.glob("*/*/*.json")))
    for label, golden in ((f"CPU matrix ({cases} cases)", cpu_only), ("whole matrix (CPU + TPU)", ROOT / "golden")):
        wall, _, code = run_timed([sys.executable, "-m", "shardscope.cli", "check", "--golden", str(golden)])
        target_applies = golden == cpu_only
        ok = ok and code == 0 and (wall <= TARGETS["check_seconds"] or not target_applies)
        target = f" (target <= {TARGETS['check_seconds']:.0f} s)" if target_applies else ""
        lines.append(f"cold `shardscope check`, {label}: {wall:.1f} s, exit {code}{target}")
    lines.append(verdict(ok))
    return lines, ok


def bench_real_shape() -> tuple[list[str], bool]:
    args = [
        sys.executable,
        "-m",
        "shardscope.cli",
        "dump",
        "deepseek3-671b",
        "--preset",
        "default",
        "--topology",
        "cpu-256",
        "--mesh",
        "fsdp=32,expert=8",
    ]
    wall, gib, code = run_timed(args)
    ok = wall <= TARGETS["real_seconds"] and gib <= TARGETS["real_gib"] and code == 0
    return [
        f"deepseek3-671b on cpu-256: {wall:.1f} s, peak RSS {gib:.2f} GiB, exit {code} "
        f"(targets <= {TARGETS['real_seconds']:.0f} s, <= {TARGETS['real_gib']:.0f} GiB): {verdict(ok)}"
    ], ok


def bench_help() -> tuple[list[str], bool]:
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "shardscope.cli", "--help"], cwd=ROOT, capture_output=True, check=True)
        timings.append(time.perf_counter() - start)
    ok = min(timings) <= TARGETS["help_seconds"]
    return [
        f"`shardscope --help`: best {min(timings):.2f} s of 5 (target <= {TARGETS['help_seconds']} s): {verdict(ok)}"
    ], ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="skip the cold check and the real-shape case")
    parser.add_argument("--repeats", type=int, default=3, help="timings per case for the dump ratio")
    parser.add_argument("--only", choices=("help", "check", "real", "dump", "parse"), help="run one section")
    args = parser.parse_args()
    sections = [("help", bench_help)]
    if not args.quick or args.only:
        # Child processes first, while this process has not started JAX (they get the cores to themselves).
        sections += [("check", bench_check), ("real", bench_real_shape)]
    sections += [("dump", lambda: bench_dump_ratio(args.repeats)), ("parse", bench_parse)]
    if args.only:
        sections = [s for s in sections if s[0] == args.only]
    results = []
    for title, bench in sections:
        lines, ok = bench()
        results.append((title, ok))
        print(f"== {title}")
        print("\n".join(lines), flush=True)
    print("== summary")
    for title, ok in results:
        print(f"{title:8} {verdict(ok)}")


if __name__ == "__main__":
    main()
