"""shardscope's expected step time against MaxText's published training runs.

Every run in `published_runs.yaml` that shardscope can plan (its model is a flavor here and it is not quantized,
or it plans through `maxtext:MODEL`; its source gives a command line) is planned from that command line on its
own TPU topology (the TPU route: libtpu compiles ahead of time) and, where it fits in this machine's memory, on
as many fake CPU devices (the CPU route, priced as the run's TPU generation). Plans are kept in
`benchmarks/plans/<id>.<route>.json`: compiling one takes minutes to half an hour here, pricing it milliseconds,
so a change to the cost model is measured on every run at once, and the calibration (`calibrate.py`) reads the
same files.

  python benchmarks/published_runs.py                  the table: measured, expected per route, error, MAPE
  python benchmarks/published_runs.py --markdown       the same table in Markdown
  python benchmarks/published_runs.py --write          regenerate the validation page's figures and the README's
  python benchmarks/published_runs.py --check          exit 1 when either is stale
  python benchmarks/published_runs.py --plan ID [...]  (re)plan runs (`all`: every plannable run), --route cpu|tpu|gpu

Runs on NVIDIA GPU clusters (`route: gpu`) plan on their own cluster (`h200-32x8`: XLA's GPU compiler, no GPU
needed) into `<id>.gpu.json`, are priced on their GPUs' published figures (uncalibrated) and show in the TPU
route's column, marked "(GPU)"; they are validation runs, and the summary gives them a line of their own. A
GPU row with `program: maxtext` (a quantized run: MaxText's fp8) plans MaxText's own step, `maxtext:MODEL`,
from its command line (`--plan ID --route gpu` on Python 3.12 with MaxText and the GPU extra).

The runs `fitting_set.yaml` names are what `calibrate.py` fits the constants of `hardware.yaml` to; every other
run validates. Each error is expected / measured - 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import shlex
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent
PLANS = ROOT / "plans"
CATALOGUE = ROOT / "published_runs.yaml"
ROUTES = ("tpu", "cpu")
GPU = "gpu"  # a GPU cluster's run: its plan is `<id>.gpu.json`, priced on its own GPUs

# Seed 003 (MaxText's explicit-sharding pipeline change, measured on v5p-8 by its author): not a catalogue
# row, but a published measurement with its command line, used the same way (validation, never fitted).
SEED_003 = "model_name=llama2-7b ici_pipeline_parallelism=2 num_pipeline_microbatches=8 pipeline_fsdp_ag_once=true"
SEED_003_ZERO1 = f"{SEED_003} ici_data_parallelism=2 shard_optimizer_over_data=true"
EXTRA_RUNS = [
    {
        "id": f"seed003-{name}-{mode}",
        "model": "llama2-7b",
        "kind": "dense (seed 003)",
        "topology": "v5p-8",
        "num_slices": 1,
        "devices": 4,
        "overrides": f"{command} shard_mode={mode}",
        "precision": "bf16",
        "measured": {"step_time_s": seconds},
        # The profile's peak HBM use as the seed writes it ("48219Mb"): MiB. MaxText's compiles of these command
        # lines (benchmarks/maxtext_programs/memory.json) allocate heaps within 0.1% of the figures read as MiB.
        "measured_memory_bytes": memory_mib * 2**20,
        "fit_quality": "seed",
    }
    for name, command, mode, seconds, memory_mib in (
        ("fsdp-pp", SEED_003, "auto", 4.567, 48219),
        ("fsdp-pp", SEED_003, "explicit", 6.822, 50913),
        ("zero1-pp", SEED_003_ZERO1, "auto", 4.636, 48315),
        ("zero1-pp", SEED_003_ZERO1, "explicit", 5.272, 47997),
    )
]


@dataclass(frozen=True)
class Row:
    """One run, its measurement and shardscope's expected step on each route that has a plan."""

    run: dict[str, Any]
    measured: float | None
    measured_kind: str
    expected: dict[str, float | None]
    dropped: tuple[str, ...]
    # Per route: the settings its command line gives today that its stored plan was planned without (a key
    # modelled since): such a plan is priced as it is and marked, until it is replanned.
    stale: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    @property
    def fitted(self) -> bool:
        """Whether the calibration uses it: a run of the fitting set (`fits_constants`) with a measured step
        time (logged, or derived from a logged or tabled throughput)."""
        return fits_constants(self.run) and self.measured is not None

    def error(self, route: str) -> float | None:
        expected = self.expected.get(route)
        if expected is None or not self.measured:
            return None
        return expected / self.measured - 1


def catalogue() -> list[dict[str, Any]]:
    """The catalogue's runs, then seed 003's two."""
    return [*yaml.safe_load(CATALOGUE.read_text())["runs"], *EXTRA_RUNS]


def through_maxtext(run: dict[str, Any]) -> bool:
    """Whether a run is planned through `maxtext:MODEL` (MaxText's own program): a TPU run whose family has no
    reference model here or that is quantized, which the reference models are not (`route: maxtext`, planned
    by hand on the TPU route), or a GPU run whose row says `program: maxtext` (its quantization is MaxText's
    own; `--plan ID --route gpu` plans it, on Python 3.12)."""
    return run.get("route") == "maxtext" or run.get("program") == "maxtext"


def planned_with(run: dict[str, Any]) -> dict[str, str]:
    """The MaxText keys a row's `planned_with` gives in place of its command line's (each said in its notes)."""
    return dict(word.split("=", 1) for word in (run.get("planned_with") or "").split())


def quantized(run: dict[str, Any]) -> bool:
    """Whether a run trains with 8-bit matmuls (MaxText's `quantization=fp8_full`, `int8`, …)."""
    return any(q in str(run.get("precision")) for q in ("int8", "fp8"))


def on_gpu(run: dict[str, Any]) -> bool:
    """Whether a run is on an NVIDIA GPU cluster (`route: gpu`): planned and priced on that cluster."""
    return run.get("route") == GPU


def plannable(run: dict[str, Any]) -> str | None:
    """Why a run cannot be planned here, or None."""
    from reference_models import MODELS

    if run["model"] not in MODELS and not through_maxtext(run):
        return "model not a shardscope flavor"
    if quantized(run) and not through_maxtext(run):
        return f"quantized ({run['precision']}; the reference models have no 8-bit matmuls)"
    if not run.get("overrides"):
        return "the source gives no command line"
    return None


FITTING_SET = ROOT / "fitting_set.yaml"


@functools.cache
def fitting_ids() -> frozenset[str]:
    """The runs that fit the cost model's constants (`fitting_set.yaml`): every other run validates.

    Raises:
      SystemExit: the list names a run the catalogue does not have."""
    named = yaml.safe_load(FITTING_SET.read_text())["runs"]
    known = {run["id"] for run in catalogue()}
    unknown = sorted(set(named) - known)
    if unknown:
        raise SystemExit(f"{FITTING_SET.name}: no such run in the catalogue: {', '.join(unknown)}")
    return frozenset(named)


def fits_constants(run: dict[str, Any]) -> bool:
    """Whether the calibration may fit its constants to a run: it is on the declared list (`fitting_set.yaml`,
    which says why each run is there). Every other run, seed 003's and those over several slices included,
    only validates."""
    return run["id"] in fitting_ids()


def _slices(run: dict[str, Any]) -> int:
    return int(run.get("num_slices") or 1)


def measured_step(run: dict[str, Any]) -> tuple[float | None, str]:
    """(seconds, "logged" | "derived"): the logged step time, else the one derived from tokens/s."""
    measured = run.get("measured") or {}
    if measured.get("step_time_s"):
        return float(measured["step_time_s"]), "logged"
    derived = (measured.get("derived") or {}).get("step_time_s")
    if derived:
        return float(derived["value"]), "derived"
    return None, "none"


def command_line(run: dict[str, Any], route: str) -> tuple[str, tuple[str, ...]]:
    """MaxText's command line for a route, without the keys this MaxText has none of (newer or older
    releases' keys; returned so the table can say which were dropped)."""
    from shardscope.case.resolve import resolve_maxtext_case
    from shardscope.errors import ShardscopeError

    words = run["overrides"].split()
    if route == "tpu":
        words += [f"compile_topology={run['topology']}", f"compile_topology_num_slices={run['num_slices']}"]
    topology = None if route == "tpu" else run["topology"] if route == GPU else f"cpu-{run['devices']}"
    dropped: list[str] = []
    while True:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                resolve_maxtext_case(run["model"], None, topology, " ".join(words), compiling=False)
            return " ".join(words), tuple(dropped)
        except ShardscopeError as err:
            unknown = re.match(r"--maxtext (\w+)=.*MaxText has no key", str(err))
            if unknown is None:
                raise
            dropped.append(unknown.group(1))
            words = [w for w in words if not w.startswith(unknown.group(1) + "=")]


def plan_path(run: dict[str, Any], route: str) -> Path:
    return PLANS / f"{run['id']}.{route}.json"


def plan_run(run: dict[str, Any], route: str) -> None:
    """Compiles one run on one route and keeps its plan (unpriced: pricing is redone at every report)."""
    import dataclasses

    import shardscope
    from shardscope.errors import MemoryExhaustedError, ShardscopeError

    if through_maxtext(run) and on_gpu(run) and route == GPU:
        plan_maxtext_gpu_run(run)
        return
    if through_maxtext(run):
        raise ShardscopeError(
            f"{run['id']} plans through maxtext:{run['model']} (Python 3.12 with MaxText): "
            f"shardscope dump maxtext:{run['model']} --topology {run['topology']} --maxtext '…' "
            f"-o {plan_path(run, 'tpu')}"
        )
    words, dropped = command_line(run, route)
    # compile_topology names the TPU one; a GPU run's cluster is its topology
    topology = "cpu-8" if route == "tpu" else run["topology"] if route == GPU else f"cpu-{run['devices']}"
    print(f"planning {run['id']} ({route} route){' without ' + ', '.join(dropped) if dropped else ''}", flush=True)
    PLANS.mkdir(exist_ok=True)
    refusal = refusal_path(run, route)
    # The run's LIBTPU_INIT_ARGS are options of its TPU compile (they decide e.g. whether matmuls are
    # windowed over their all-gathers); flags this libtpu does not have are dropped and said.
    flags = xla_settings(run) if route == "tpu" else {}
    while True:
        try:
            plan = shardscope.plan_case(run["model"], topology=topology, maxtext=words, settings=flags)
            break
        except ShardscopeError as err:
            unknown = re.match(r"--set (xla\.\w+): the .* compiler has no such option", str(err))
            if unknown is not None:
                print(f"  dropped {unknown.group(1)} (not an option of this libtpu)", flush=True)
                flags.pop(unknown.group(1))
                continue
            if not isinstance(err, MemoryExhaustedError):
                raise  # not a verdict on the run: shardscope cannot plan it
            refusal.write_text(f"{err}\n")  # the compiler refused it (memory): that is the run's verdict
            print(f"  refused: {err}", flush=True)
            return
    refusal.unlink(missing_ok=True)
    shardscope.save_plan(dataclasses.replace(plan, estimate=None), plan_path(run, route))


# Of a GPU run's XLA_FLAGS, those that decide which ops its program has: whether its matmuls are Triton's
# fusions or cuBLAS's calls (a float8 one cuBLASLt's fp8 gemm). The others steer the scheduler, the combining of
# collectives and memory; a `program: maxtext` row passes these to the GPU compile as MaxText's
# `compile_xla_flags`, and its notes say so.
GPU_PROGRAM_FLAGS = ("xla_gpu_enable_triton_gemm",)


def maxtext_gpu_words(run: dict[str, Any]) -> list[str]:
    """A `program: maxtext` GPU run's command line for `maxtext:MODEL` on its cluster: its overrides less
    `model_name` (the model is maxtext:NAME), the keys `planned_with` gives in their place, and the run's
    `GPU_PROGRAM_FLAGS` as `compile_xla_flags`."""
    replaced = planned_with(run)
    words = []
    for word in run["overrides"].split():
        key = word.split("=", 1)[0]
        if key != "model_name":
            words.append(f"{key}={replaced.pop(key)}" if key in replaced else word)
    words += [f"{key}={value}" for key, value in replaced.items()]
    flags = [w for w in (run.get("xla_flags") or "").split() if w.removeprefix("--").split("=")[0] in GPU_PROGRAM_FLAGS]
    # Quoted: each word is read as a shell word (`parse_maxtext_args`), and several flags are one value.
    return words + ([f"compile_xla_flags={shlex.quote(' '.join(flags))}"] if flags else [])


def plan_maxtext_gpu_run(run: dict[str, Any]) -> None:
    """Compiles a `program: maxtext` GPU run's own step (MaxText's program, `maxtext:MODEL`) on its cluster and
    keeps its plan, or the compiler's memory refusal."""
    import dataclasses

    import shardscope
    from shardscope.errors import MemoryExhaustedError

    words = maxtext_gpu_words(run)
    print(f"planning {run['id']} (gpu route, maxtext:{run['model']}): {' '.join(words)}", flush=True)
    PLANS.mkdir(exist_ok=True)
    refusal = refusal_path(run, GPU)
    try:
        plan = shardscope.plan_case(f"maxtext:{run['model']}", topology=run["topology"], maxtext=words)
    except MemoryExhaustedError as err:
        refusal.write_text(f"{err}\n")
        print(f"  refused: {err}", flush=True)
        return
    refusal.unlink(missing_ok=True)
    given = dict(word.split("=", 1) for word in run["overrides"].split())
    instead = [f"{k}={v} in place of {k}={given.get(k, '(unset)')}" for k, v in planned_with(run).items()]
    if instead:  # the plan says what it was planned with instead of the run's command line, and where it is told why
        note = f"{'; '.join(instead)} (published_runs.yaml, {run['id']}: its notes say why)"
        plan = dataclasses.replace(plan, provenance=tuple(sorted((*plan.provenance, ("planned_with", note)))))
    shardscope.save_plan(dataclasses.replace(plan, estimate=None), plan_path(run, GPU))


# Of a run's XLA flags, those that decide which ops the compiled program has (the cost model prices ops):
# whether a matmul is windowed over its all-gather; and whether its kernels compile at all: the vector
# memory a kernel may use (the attention kernel at blocks of 2048 needs more than the default). The others
# steer the scheduler, memory placement and the sparse cores; with all of them the TPU compile of
# llama3.1-8b on v6e-16 ran over 35 minutes here (8 without), and a subset without the scheduler's
# memory-pressure tracking no longer fit in HBM, so the benchmark passes these only and says so.
PROGRAM_FLAGS = ("xla_jf_spmd_threshold_for_windowed_einsum_mib", "xla_tpu_scoped_vmem_limit_kib")


def xla_settings(run: dict[str, Any]) -> dict[str, str]:
    """The run's XLA flags that shape its program (`PROGRAM_FLAGS`) as shardscope settings (`xla.name`)."""
    settings = {}
    for word in (run.get("xla_flags") or "").split():
        name, _, value = word.removeprefix("--").partition("=")
        if name in PROGRAM_FLAGS:
            settings[f"xla.{name}"] = value or "true"
    return settings


def refusal_path(run: dict[str, Any], route: str) -> Path:
    return PLANS / f"{run['id']}.{route}.refused"


def expected_on(run: dict[str, Any], route: str) -> float | None:
    """The expected step of a run's stored plan, priced on the run's generation (None: no plan)."""
    import shardscope
    from shardscope.cost.price import price_plan

    path = plan_path(run, route)
    if not path.exists():
        return None
    plan = shardscope.load_plan(path)
    priced = price_plan(plan, None if route in ("tpu", GPU) else run["topology"].rsplit("-", 1)[0])
    return None if priced.estimate is None else priced.estimate.expected


def planned_without(run: dict[str, Any], route: str) -> tuple[str, ...]:
    """The settings (other than the compiler's flags) that the run's command line resolves to today and its
    stored plan on this route does not have: keys modelled after it was planned."""
    import shardscope
    from shardscope.case.resolve import resolve_maxtext_case

    if through_maxtext(run):
        return ()  # its notes in the catalogue say which keys its plan was made without
    planned = dict(shardscope.load_plan(plan_path(run, route)).case.overrides)
    words, _ = command_line(run, route)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        topology = None if route == "tpu" else run["topology"] if route == GPU else f"cpu-{run['devices']}"
        case, _ = resolve_maxtext_case(run["model"], None, topology, words, compiling=False)
    now = {k: v for k, v in dict(case.overrides).items() if not k.startswith("xla.")}
    return tuple(sorted(f"{k}={v}" for k, v in now.items() if planned.get(k) != v))


def rows() -> list[Row]:
    out = []
    for run in catalogue():
        if plannable(run) is not None:
            continue
        measured, kind = measured_step(run)
        routes = (GPU,) if on_gpu(run) else ROUTES
        expected = {route: expected_on(run, route) if route in routes else None for route in (*ROUTES, GPU)}
        if all(v is None for v in expected.values()):
            continue
        stale = {route: planned_without(run, route) for route in routes if expected[route] is not None}
        out.append(Row(run, measured, kind, expected, (), stale))
    return out


def runs(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


def mape(errors: list[float]) -> str:
    return f"{100 * sum(abs(e) for e in errors) / len(errors):.1f}%" if errors else "–"


def _slices_note(run: dict[str, Any]) -> str:
    return f" ({_slices(run)} slices)" if _slices(run) > 1 else ""


def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def _error(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:+.1f}%"


def _tpu_or_gpu(row: Row) -> list[str]:
    """The TPU route's cells (expected, error), or a GPU run's own route there, named."""
    route = GPU if on_gpu(row.run) else "tpu"
    mark = ("†" if row.stale.get(route) else "") + (" (GPU)" if route == GPU else "")
    return [_seconds(row.expected[route]) + mark, _error(row.error(route))]


def table(found: list[Row], markdown: bool) -> str:
    header = ["run", "kind", "measured", "TPU route", "error", "CPU route", "error"]
    lines = []
    for row in found:
        kind = f"{row.run.get('kind')}{_slices_note(row.run)}, {'fitted' if row.fitted else 'validation'}"
        measured = _seconds(row.measured) + (" (derived)" if row.measured_kind == "derived" else "")
        lines.append(
            [
                row.run["id"],
                kind,
                measured,
                *_tpu_or_gpu(row),
                _seconds(row.expected["cpu"]) + ("†" if row.stale.get("cpu") else ""),
                _error(row.error("cpu")),
            ]
        )
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(line) + " |" for line in lines]
    else:
        widths = [max(len(str(x)) for x in column) for column in zip(header, *lines, strict=True)]
        out = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)) for line in [header, *lines]]
    bullet = "- " if markdown else ""
    missing = sorted({s for row in found for route in (*ROUTES, GPU) for s in row.stale.get(route, ())})
    if missing:
        count = sum(bool(row.stale.get(route)) for row in found for route in (*ROUTES, GPU))
        plans, its, them = ("1 plan was", "its", "it") if count == 1 else (f"{count} plans were", "their", "them")
        out.append(
            f"{bullet}† {plans} planned before {its} command line's {', '.join(missing)} was modelled: "
            f"priced without it until replanned (`--plan ID --route tpu|cpu`); the MAPEs include {them}"
        )
    out += [bullet + line for line in summary(found)]
    return "\n".join(out)


APART = 0.05  # pairs of runs measured closer than this are too close to call for the order check
OUTSIDE = 0.20  # a validation error beyond this is named


def summary(found: list[Row], left_out: dict[tuple[str, str], float] | None = None) -> list[str]:
    """The figures the table comes to, per route: the fitting runs' MAPE (in sample, and each left out of
    the fit when `left_out` gives (run id, route) → error), the validation runs' MAPE, worst error, the runs
    outside ±20% and the published order, the validation MoE runs', the runs planned through maxtext:
    and the quantized runs', and how far the CPU route's expected step is from the TPU route's."""
    lines = []
    for route in ROUTES:
        name = route.upper()
        fitted = [e for r in found if r.fitted and (e := r.error(route)) is not None]
        loo = [e for (run, where), e in (left_out or {}).items() if where == route]
        out_of_sample = f", {mape(loo)} each left out of the fit" if loo else ""
        lines.append(
            f"{name} route, fitting runs: MAPE {mape(fitted)} in sample{out_of_sample}, over {runs(len(fitted))}"
        )
        validation = [r for r in found if not r.fitted and r.error(route) is not None]
        errors = [r.error(route) or 0.0 for r in validation]
        outside = [r.run["id"] for r in validation if abs(r.error(route) or 0.0) > OUTSIDE]
        worst = max((abs(e) for e in errors), default=0.0)
        lines.append(
            f"{name} route, validation runs: MAPE {mape(errors)} over {runs(len(errors))}, worst {100 * worst:.1f}%, "
            f"{len(outside)} outside ±{100 * OUTSIDE:.0f}%{' (' + ', '.join(outside) + ')' if outside else ''}; "
            f"{order(validation, route)}"
        )
        for label, pick in (
            ("validation MoE runs", lambda r: r.run.get("kind") == "moe"),
            ("validation runs planned through maxtext:MODEL", lambda r: through_maxtext(r.run)),
            ("validation runs of quantized (8-bit) training", lambda r: quantized(r.run)),
        ):
            chosen = [r.error(route) or 0.0 for r in validation if pick(r)]
            if chosen:
                worst = max(abs(e) for e in chosen)
                lines.append(
                    f"{name} route, {label}: MAPE {mape(chosen)} over {runs(len(chosen))}, worst {100 * worst:.1f}%"
                )
    on_gpus = [r for r in found if r.error(GPU) is not None]
    for label, chosen in (
        ("validation runs", on_gpus),
        ("validation runs planned through maxtext:MODEL", [r for r in on_gpus if through_maxtext(r.run)]),
    ):
        if chosen:
            errors = [r.error(GPU) or 0.0 for r in chosen]
            lines.append(
                f"GPU route (uncalibrated, NVIDIA's figures), {label}: MAPE {mape(errors)} "
                f"over {runs(len(errors))}, worst {100 * max(abs(e) for e in errors):.1f}%"
            )
    both = [r for r in found if r.expected["tpu"] and r.expected["cpu"]]
    if both:
        gaps = [abs((r.expected["cpu"] or 0) / (r.expected["tpu"] or 1) - 1) for r in both]
        within = sum(g <= 0.10 for g in gaps)
        lines.append(
            f"CPU route against the TPU route: within 10% on {within} of {len(both)} runs compiled both ways, "
            f"at most {100 * max(gaps):.1f}% apart"
        )
    return lines


def order(rows: list[Row], route: str) -> str:
    """How many pairs of runs the expected steps order as the measured ones do (ties in either count as
    ordered; pairs measured within `APART` of each other are left out as too close to call)."""
    kept = agreed = 0
    for i, a in enumerate(rows):
        for b in rows[i + 1 :]:
            if a.measured is None or b.measured is None or abs(a.measured / b.measured - 1) < APART:
                continue
            kept += 1
            mine = (a.expected[route] or 0) - (b.expected[route] or 0)
            agreed += mine == 0 or (mine > 0) == (a.measured > b.measured)
    return f"published order kept in {agreed} of {kept} pairs more than {100 * APART:.0f}% apart"


def _gb(value: float | None) -> str:
    return "–" if value is None else f"{value / 1e9:.1f} GB"


def maxtext_memory(run: dict[str, Any]) -> tuple[float, str] | None:
    """MaxText's logged memory need of a run in bytes and what the figure is: the compiler's static sum
    (arguments + outputs - aliased + temporaries, as MaxText logs it) where logged, else the measured peak
    (seed 003), else None."""
    memory = (run.get("measured") or {}).get("memory") or {}
    estimate = memory.get("compiler_estimate") or {}
    if "total_estimated_memory_size" in estimate:
        # MaxText logs it as "GB" but divides by 1024³ (max_utils.print_compiled_memory_stats): GiB.
        return float(estimate["total_estimated_memory_size"]) * 2**30, "static sum"
    if "measured_memory_bytes" in run:
        return float(run["measured_memory_bytes"]), "peak"
    return None


def cpu_verdict(run: dict[str, Any]) -> str:
    """The CPU route's fit verdict on the run's generation: the tensors' estimate against capacity."""
    import shardscope
    from shardscope.cost.price import price_plan

    path = plan_path(run, "cpu")
    if not path.exists():
        return "–"
    estimate = price_plan(shardscope.load_plan(path), run["topology"].rsplit("-", 1)[0]).estimate
    if estimate is None:
        return "–"
    verdict = "fits" if estimate.memory.fits else "does not fit"
    return f"{verdict} ({estimate.memory.total / 1e9:.1f} GB, a floor)"


def gpu_verdict(path: Path) -> str:
    """A GPU plan's fit as its compiler's figures say (the GPU compiler places what does not fit, too)."""
    import shardscope
    from shardscope.cost.price import price_plan

    memory = price_plan(shardscope.load_plan(path)).estimate.memory  # type: ignore[union-attr]
    return f"{'fits' if memory.fits else 'does not fit'} ({_gb(memory.total)} of {_gb(memory.capacity)})"


def memory_table(markdown: bool) -> str:
    """Each plannable run: its command line, whether the TPU compiler placed it, shardscope's HBM need (the
    compiler's peak, and the static sum arguments + outputs + temporaries - aliased) and MaxText's figure,
    with the error of the like figure (peak against a measured peak, static sum against a logged sum)."""
    import shardscope
    from shardscope.cost.memory import hbm_peak_bytes

    header = ["run", "command line (MaxText)", "TPU compile", "shardscope HBM: peak (static sum)", "MaxText's"]
    header += ["error", "CPU route says"]
    lines = []
    for run in catalogue():
        why = plannable(run)
        if why is not None:
            continue
        route = GPU if on_gpu(run) else "tpu"
        path, refusal = plan_path(run, route), refusal_path(run, route)
        figures: dict[str, float | None] = {"peak": None, "static sum": None}
        if path.exists():
            memory = dict(shardscope.load_plan(path).memory)
            figures["peak"] = hbm_peak_bytes(memory)
            figures["static sum"] = (
                memory["argument_bytes"] + memory["output_bytes"] + memory["temp_bytes"] - memory["alias_bytes"]
            )
            outcome = "fits" if route == "tpu" else f"GPU compile: {gpu_verdict(path)}"
        elif refusal.exists():
            outcome = "refused: " + refusal.read_text().strip().split("(", 1)[-1].rstrip(")")[:90]
        else:
            outcome = "not compiled here yet"
        ours = "–" if figures["static sum"] is None else f"{_gb(figures['peak'])} ({_gb(figures['static sum'])})"
        logged = maxtext_memory(run)
        theirs, error = "–", "–"
        if logged is not None:
            theirs = f"{_gb(logged[0])} ({logged[1]})"
            like = figures[logged[1]]
            error = "–" if like is None else f"{like / logged[0] - 1:+.1%}"
        lines.append([run["id"], f"`{run['overrides']}`", outcome, ours, theirs, error, cpu_verdict(run)])
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(out + ["| " + " | ".join(line) + " |" for line in lines])
    return "\n".join("  ".join(line) for line in [header, *lines])


# The validation page and the README hold generated figures between their markers; nothing else there is.
PAGE = ROOT.parent / "docs" / "concepts" / "validation.md"
PAGE_START = "<!-- published-runs table: generated by `python benchmarks/published_runs.py --write` -->"
PAGE_END = "<!-- end of published-runs table -->"
README = ROOT.parent / "README.md"
README_START = "<!-- validation summary: generated by `python benchmarks/published_runs.py --write` -->"
README_END = "<!-- end of validation summary -->"


def calibration_id() -> str:
    """A name for the calibration the figures were priced under: a hash of hardware.yaml's fitted constants
    and of the fitting set (the same constants and set give the same name on every machine)."""
    import hashlib

    table = yaml.safe_load((ROOT.parent / "shardscope" / "case" / "hardware.yaml").read_text())["calibration"]
    text = yaml.safe_dump(table, sort_keys=True) + FITTING_SET.read_text()
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def left_out_errors() -> dict[tuple[str, str], float]:
    """Each fitting run's error on each route at the fit without it (calibrate.py's leave-one-out)."""
    import calibrate

    runs = calibrate.fitting_runs(catalogue())
    found = calibrate.errors(runs, calibrate.fit(runs), calibrate.leave_one_out(runs))
    return {(e.run, e.route): e.left_out for e in found if e.left_out is not None}


def planned_release(run: dict[str, Any]) -> str:
    """The MaxText and JAX its stored plan was compiled with, as its provenance names them (plans of one release
    keep that release's compiler: a stored plan is never silently re-made under another)."""
    import shardscope

    route = GPU if on_gpu(run) else "tpu"
    provenance = dict(shardscope.load_plan(plan_path(run, route)).provenance)
    release = provenance.get("maxtext", "?").split(" ", 1)[0]
    return f"MaxText {release}, JAX {provenance.get('jax', '?')}"


def page_block(found: list[Row], left_out: dict[tuple[str, str], float]) -> str:
    """The validation page's generated part: the summary, every run's row, its command line and the memory
    table."""
    header = ["run", "kind", "topology", "set", "measured", "TPU route", "error", "CPU route", "error"]
    lines = [
        f"Priced under calibration `{calibration_id()}` (`shardscope/case/hardware.yaml`, fitted by",
        "`benchmarks/calibrate.py` on the runs `benchmarks/fitting_set.yaml` names; every other run validates).",
        "Every expected step is an estimate: the TPU route's from the step compiled ahead of time for the run's",
        "TPU topology, the CPU route's from the step compiled on as many fake CPU devices and priced as the run's",
        "TPU generation. Error = expected / measured - 1.",
        "",
        *(f"- {line}" for line in summary(found, left_out)),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for row in found:
        measured = _seconds(row.measured) + (" (derived)" if row.measured_kind == "derived" else "")
        cells = [
            row.run["id"],
            f"{row.run.get('kind')}{_slices_note(row.run)}",
            row.run["topology"] if _slices(row.run) == 1 else f"{_slices(row.run)} × {row.run['topology']}",
            "fitted" if row.fitted else "validation",
            measured,
            *_tpu_or_gpu(row),
            _seconds(row.expected["cpu"]),
            _error(row.error("cpu")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "### Command lines", "", "Each run's MaxText command line as published (after its model's name).", ""]
    for row in found:
        instead = " ".join(f"{k}={v}" for k, v in planned_with(row.run).items())
        with_keys = f", with `{instead}` in its place, see the run's notes" if instead else ""
        through = (
            f" (planned as `maxtext:{row.run['model']}` under {planned_release(row.run)}{with_keys})"
            if through_maxtext(row.run)
            else ""
        )
        lines.append(f"- `{row.run['id']}`{through}: `{row.run['overrides']}`")
    lines += ["", "### Memory", "", memory_table(True)]
    return "\n".join(lines)


def with_block(text: str, start: str, end: str, block: str) -> str:
    """`text` with what lies between its two markers replaced by `block` (unchanged without the markers)."""
    if start not in text:
        return text
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    return f"{before}{start}\n{block}\n{end}{after}"


def generated(found: list[Row], left_out: dict[tuple[str, str], float]) -> dict[Path, str]:
    """The validation page and the README, each with its generated figures as the stored plans give them."""
    readme = "\n".join(f"- {line}" for line in summary(found, left_out))
    return {
        PAGE: with_block(PAGE.read_text(), PAGE_START, PAGE_END, page_block(found, left_out)),
        README: with_block(README.read_text(), README_START, README_END, readme),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", nargs="*", metavar="ID", help="(re)plan these runs ('all': every plannable run)")
    parser.add_argument("--route", choices=(*ROUTES, GPU), default="tpu")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--memory", action="store_true", help="the memory table: each run's HBM need")
    parser.add_argument("--write", action="store_true", help="regenerate the validation page's and README's figures")
    parser.add_argument("--check", action="store_true", help="exit 1 when those figures are stale")
    args = parser.parse_args(argv)
    if args.plan is not None:
        runs = {run["id"]: run for run in catalogue()}
        chosen = [r for r in runs.values() if plannable(r) is None] if args.plan == ["all"] else []
        for name in args.plan if args.plan != ["all"] else []:
            if name not in runs:
                print(f"unknown run {name!r}", file=sys.stderr)
                return 2
            chosen.append(runs[name])
        if len(chosen) == 1:
            from shardscope.errors import ShardscopeError

            try:
                plan_run(chosen[0], args.route)
            except ShardscopeError as err:
                print(f"{chosen[0]['id']}: not planned: {err}", file=sys.stderr)
                return 2
            return 0
        # A process sizes its device pool once: every run plans in a process of its own.
        for run in chosen:
            subprocess.run([sys.executable, __file__, "--plan", run["id"], "--route", args.route], check=False)
        return 0
    if args.memory:
        print(memory_table(args.markdown))
        return 0
    found = rows()
    if not found:
        print("no stored plans: run with --plan first", file=sys.stderr)
        return 1
    if args.write or args.check:
        from shardscope.atomic import write_atomic

        wanted = generated(found, left_out_errors())
        stale = [path for path, text in wanted.items() if path.read_text() != text]
        if args.check:
            for path in stale:
                print(f"{path.name} is stale: run python benchmarks/published_runs.py --write", file=sys.stderr)
            return 1 if stale else 0
        for path in stale:
            write_atomic(path, wanted[path])
            print(f"wrote {path.name}")
        return 0
    print("Expected step time (estimates) against MaxText's measured step times; error = expected / measured - 1")
    print(table(found, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
