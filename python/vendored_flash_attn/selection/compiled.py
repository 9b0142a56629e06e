"""A compiled family's module and build record, as its adapter (fa2.py, fa3.py) and the
interface reach them: import the module (which registers its ops) and read its record,
with the package's error for each way that fails."""

from __future__ import annotations

import torch

from ..declaration.build_info import BuildInfoMissing, ComponentInfo
from .environment import current_environment
from ..errors import FlashAttnUnavailableError
from ..declaration.families import registry


def component(version: int) -> ComponentInfo:
    """The build record of the family of ``version``."""
    try:
        return current_environment().build_info().component(version)
    except BuildInfoMissing as exc:
        raise FlashAttnUnavailableError(str(exc)) from exc


def ops(version: int):
    """The op namespace of ``version``'s compiled module; importing it registers its ops."""
    family = registry()[version]
    error = current_environment().load_module(version)
    if error is not None:
        raise FlashAttnUnavailableError(f"the {family.title} module failed to import: {error}")
    return getattr(torch.ops, family.op_namespace)
