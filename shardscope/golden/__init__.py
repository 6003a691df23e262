"""Plans made end to end and guarded.

- `cache`: the plan cache (an unchanged case is never compiled again);
- `planning`: a case planned end to end (compile, extract, lint) through the cache; `lint` and `--step`;
- `cases`: `cases.yaml` of a golden directory; `store`: where goldens live, read and written atomically;
- `check`: `check` and `update` as data; `runner`: many cases on worker processes; `ray_pool`: on Ray;
- `verifying`: the numerics of cases that carry `verify:`, run for real.
"""
