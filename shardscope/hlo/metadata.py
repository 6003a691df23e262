"""What an HLO instruction's metadata says: its pass (forward / backward / optimizer) and the Flax module
it came from, read off `op_name`; plus the bracket-aware text splitting the HLO parser shares.
"""

from __future__ import annotations

import re

from shardscope.hlo.markers import is_marker

_IDENT_RE = re.compile(r"^[A-Za-z_][\w\-]*$")
_METHOD_RE = re.compile(r"^[A-Za-z_][\w\-]*\.[A-Za-z_]\w*$")  # Flax's scope for a method call, "moe._routed"
# Scopes that jax/flax transforms add to the name stack; they are not module names. JAX 0.11 names a scan's
# body `eval_jaxpr` where JAX 0.10 named it `closed_call`.
_TRANSFORM_SCOPES = frozenset(
    {"while", "body", "cond", "closed_call", "core_call", "shard_map", "checkpoint", "remat", "rematted_computation"}
    | {"scan", "pjit", "jit", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "branch", "switch"}
    | {"eval_jaxpr"}
)


_BRACKETS = re.compile(r"[()\[\]{}]")
_OP_NAME = re.compile(r'op_name="([^"\\]*(?:\\.[^"\\]*)*)"')


def op_name_in(metadata: str | None) -> str:
    """The `op_name` an instruction's `metadata={...}` attribute holds ("" when it has none)."""
    match = _OP_NAME.search(metadata or "")
    return match.group(1) if match else ""


def matching_bracket(text: str, open_at: int) -> int:
    """Index of the bracket closing the one at `text[open_at]` (or len(text) if unbalanced)."""
    depth = 0
    for m in _BRACKETS.finditer(text, open_at):
        depth += 1 if m.group() in "([{" else -1
        if depth == 0:
            return m.start()
    return len(text)


def split_outside_brackets(text: str, sep: str) -> list[str]:
    """Splits on `sep` (one character) outside any brackets."""
    if not _BRACKETS.search(text):
        return text.split(sep)
    parts, depth, start = [], 0, 0
    for m in re.finditer(r"[()\[\]{}" + re.escape(sep) + "]", text):
        c = m.group()
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            parts.append(text[start : m.start()])
            start = m.end()
    return [*parts, text[start:]]


def pass_of(op_name: str) -> str:
    """forward / backward / optimizer / other from an op_name: the outermost autodiff transform wins."""
    if "transpose(" in op_name:
        return "backward"
    if "jvp(" in op_name:
        return "forward"
    return "optimizer" if "jit(" in op_name else "other"


def _alternatives(op_name: str) -> list[str]:
    """Unmerges op_names XLA combined as `a;b` or `prefix/(x/y:z/w)` into one name per original op."""
    out: list[str] = []
    for name in op_name.split(";"):
        m = re.search(r"(?:^|/)\(", name)
        if not m:
            out.append(name)
            continue
        start, end = m.end() - 1, matching_bracket(name, m.end() - 1)
        for part in split_outside_brackets(name[start + 1 : end], ":"):
            out.extend(_alternatives(name[:start] + part + name[end + 1 :]))
    return out


def primitive_of(op_name: str) -> str:
    """The jax primitive an op_name ends in (of the first op, for names XLA merged from several)."""
    names = _alternatives(op_name) if op_name else []
    return split_outside_brackets(names[0], "/")[-1] if names else ""


def module_path(op_name: str) -> str:
    """The Flax module path in an op_name, e.g. "decoder/layers/moe".

    jax names an op `<name stack>/<primitive>`; Flax pushes each module's name on the stack. So the last
    segment (the primitive) is dropped; transform wrappers (`jit(f)`, `jvp(Model)`, `transpose(...)`),
    transform scopes (while, body, closed_call, shard_map, checkpoint, ...), method scopes
    (`moe._routed`) and kernel markers (`shardscope.hlo.markers`: they name no module) are skipped; and
    the path ends at the first segment that is no identifier (e.g. an
    einsum spec `td,de->te` inside the module). Names XLA merged from several ops give their common prefix.
    """
    paths = []
    for name in _alternatives(op_name):
        path: list[str] = []
        for segment in split_outside_brackets(name, "/")[:-1]:
            skipped = segment in _TRANSFORM_SCOPES or _METHOD_RE.match(segment) or is_marker(segment)
            if "(" in segment or "[" in segment or skipped:
                continue
            if not _IDENT_RE.match(segment):
                break
            path.append(segment)
        paths.append(path)
    common = paths[0] if paths else []
    for path in paths[1:]:
        n = 0
        while n < min(len(common), len(path)) and common[n] == path[n]:
            n += 1
        common = common[:n]
    return "/".join(common)
