"""Component parameters that take their defaults from where each default is defined.

KFP embeds a lightweight component's source text in the pipeline and runs it where nothing of
ampbench is imported yet, so a `def` line cannot say `epochs: int = TrainConfig.epochs`. KFP
reads a component's interface through inspect.signature, which honours `__signature__`: the
source declares these parameters without a default, and `with_defaults` supplies them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def with_defaults(defaults: Mapping[str, Any]) -> Callable[[F], F]:
    """Give the named parameters of the decorated function these defaults."""

    def apply(function: F) -> F:
        signature = inspect.signature(function)
        unknown = set(defaults) - set(signature.parameters)
        if unknown:
            raise TypeError(f"{function.__name__} has no parameter {sorted(unknown)}")
        parameters = [
            parameter.replace(default=defaults[name]) if name in defaults else parameter
            for name, parameter in signature.parameters.items()
        ]
        function.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        return function

    return apply
