"""Which network a GPU cluster's collective rides: NVLink inside one domain, or the network between domains.

A row's groups are the devices that vary along its mesh axes with the others held; they stay on NVLink when
every group's GPUs share a domain (an HGX host's 8 GPUs, a GB200 NVL72 rack's 72), and cross the network
(InfiniBand or RoCE, through each GPU's NIC) otherwise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardscope.case.gpu import GpuCluster
from shardscope.plan.records import CollectiveRow
from shardscope.stages.devices import domain_grid

NVLINK = "nvlink"
NETWORK = "network"


def link_of(axes: Sequence[str], names: Sequence[str], domains: np.ndarray) -> str:
    """ "nvlink" or "network" for a group set spanning mesh `axes` of a mesh whose positions (axes `names`)
    lie in NVLink `domains`."""
    moved = [names.index(axis) for axis in axes]
    held = [i for i in range(len(names)) if i not in moved]
    groups = domains.transpose(held + moved).reshape(int(np.prod([domains.shape[i] for i in held])), -1)
    return NVLINK if bool((groups == groups[:, :1]).all()) else NETWORK


def with_links(rows: Sequence[CollectiveRow], mesh: Any, gpu: GpuCluster) -> tuple[CollectiveRow, ...]:
    """The rows of a GPU cluster's plan, each marked with the network it crosses (rows whose groups match no
    mesh axes stay unmarked)."""
    ids = np.vectorize(lambda device: device.id, otypes=[int])(mesh.devices)
    domains = domain_grid(gpu, ids)
    names = [str(axis) for axis in mesh.axis_names]
    return tuple(
        row if row.axes is None else dataclasses.replace(row, link=link_of(row.axes, names, domains)) for row in rows
    )
