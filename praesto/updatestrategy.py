"""spec.updateStrategy: how a changed source revision rolls over a cache's nodes (issue #25 part 1).

Parsed here, apart from praesto.spec (which holds the rest of the ModelCache spec), with the same
error shape: the field, the cause and the fix. hooks/rolling.py and the agent act on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from praesto import names
from praesto.refs import SpecError


@dataclass(frozen=True)
class UpdateStrategy:
    """spec.updateStrategy: how a changed revision rolls over the selected nodes (local mode)."""

    switch: str = names.DEFAULT_SWITCH_POLICY  # EachNode: as soon as a node holds it; AllNodes: together
    max_fetching: int = 0  # nodes fetching the new revision beside the old one at once; 0: no limit


def parse_update_strategy(value: Any, errors: list[SpecError]) -> UpdateStrategy:
    if value is None:
        return UpdateStrategy()
    if not isinstance(value, dict):
        errors.append(
            SpecError("spec.updateStrategy", "must be an object", "set switch and/or maxFetching", value)
        )
        return UpdateStrategy()
    switch = value.get("switch", names.DEFAULT_SWITCH_POLICY)
    if switch not in names.SWITCH_POLICIES:
        errors.append(
            SpecError(
                "spec.updateStrategy.switch",
                f"must be one of {', '.join(names.SWITCH_POLICIES)}",
                f"set switch: {names.SWITCH_EACH_NODE} (each node serves the new revision once it holds it) "
                f"or {names.SWITCH_ALL_NODES} (only once every selected node holds it)",
                switch,
            )
        )
        switch = names.DEFAULT_SWITCH_POLICY
    fetching = value.get("maxFetching", 0)
    if isinstance(fetching, bool) or not isinstance(fetching, int) or fetching < 0:
        errors.append(
            SpecError(
                "spec.updateStrategy.maxFetching",
                "must be a whole number, 0 or more",
                "set how many nodes may fetch a new revision at once (0: all)",
                fetching,
            )
        )
        fetching = 0
    return UpdateStrategy(str(switch), int(fetching))
