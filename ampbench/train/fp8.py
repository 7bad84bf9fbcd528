"""Float8 training of a model's nn.Linear layers with torchao: the fp8 and fp8-rowwise arms.

torchao swaps eligible nn.Linear layers for Float8Linear, whose matmuls cast to float8 with
dynamic scales on FP8 tensor cores (CUDA capability 8.9 and newer); weights stay fp32.
  fp8          "tensorwise": one scale per tensor, e4m3 forward, e5m2 gradients (fastest)
  fp8-rowwise  "rowwise": a power-of-two scale per row, e4m3 throughout (more accurate)
torchao's auto-filter takes only layers large enough to pay for the casts (dims multiples of
16), so a model with none to convert is refused rather than measured as bf16 under an fp8
label. torchao is an optional extra, imported only when an fp8 arm is built.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
from types import ModuleType

from torch import nn

from ampbench.errors import AmpbenchError
from ampbench.train.precisions import FP8_RECIPES

# The precision each recipe is offered as (the registry maps precision to recipe).
_PRECISION_OF = {recipe: precision for precision, recipe in FP8_RECIPES.items()}


def torchao_version() -> str | None:
    """The installed torchao's version, or None: found without importing it."""
    if importlib.util.find_spec("torchao") is None:
        return None
    try:
        return importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def require_torchao(precision: str) -> str:
    """torchao's version, or a one-line error naming the precision that needs it."""
    version = torchao_version()
    if version is None:
        raise AmpbenchError(
            f"--precision {precision}: float8 training needs torchao, which is not installed "
            "(pip install 'ampbench[fp8]')"
        )
    return version


def _float8(precision: str) -> ModuleType:
    require_torchao(precision)
    import torchao.float8

    return torchao.float8


def _recipe_precision(recipe: str) -> str:
    if recipe not in _PRECISION_OF:
        raise ValueError(f"float8 recipe '{recipe}' is not one of {', '.join(_PRECISION_OF)}")
    return _PRECISION_OF[recipe]


def _skip_reason(layer: nn.Linear) -> str:
    """Why torchao's auto-filter leaves this layer in high precision, in a few words."""
    out_features, in_features = layer.weight.shape
    if in_features % 16 or out_features % 16:
        return "dims not multiples of 16"
    return "too small for float8 to pay"


def _describe(skipped: list[tuple[str, nn.Linear]]) -> str:
    shown = [
        f"'{name}' {layer.in_features}->{layer.out_features} ({_skip_reason(layer)})"
        for name, layer in skipped[:3]
    ]
    more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
    return ", ".join(shown) + more


def _convertible_linears(
    model: nn.Module, precision: str, name: str
) -> list[tuple[str, nn.Linear]]:
    """The model's Linear layers whose forward runs, by name; refused where there are none or
    the model is a bare Linear."""
    linears = [
        (fqn, module)
        for fqn, module in model.named_modules()
        # nn.MultiheadAttention's out_proj is a Linear whose forward is never called (the
        # attention uses its weight directly): converting it would change nothing.
        if isinstance(module, nn.Linear)
        and not isinstance(module, nn.modules.linear.NonDynamicallyQuantizableLinear)
    ]
    if not linears:
        raise AmpbenchError(
            f"--precision {precision}: model {name} has no nn.Linear layer, the only kind "
            "float8 training converts; use bf16 or fp16 for it"
        )
    if isinstance(model, nn.Linear):
        # torchao returns a new module for a bare Linear instead of converting in place.
        raise AmpbenchError(
            f"--precision {precision}: model {name} is a bare nn.Linear; float8 training "
            "converts the layers inside a model (wrap it in an nn.Sequential)"
        )
    return linears


def convert_for_fp8(
    model: nn.Module,
    recipe: str,
    emulate: bool,
    *,
    model_name: str | None = None,
    auto_filter: bool = True,
) -> int:
    """Convert `model`'s eligible nn.Linear layers, in place, to torchao's float8 training for
    `recipe` ("tensorwise" or "rowwise"); return how many were converted.

    Which layers: those torchao's auto-filter for the recipe picks (dims multiples of 16 and
    above its size thresholds), or with auto_filter=False every layer whose dims are multiples
    of 16 (what the kernels require; smaller ones then run slower than bf16 would). `emulate`
    runs the matmuls in fp32 on the float8-rounded operands (a CPU, or a GPU without FP8
    tensor cores): the numerics of float8 training without its speed.

    Call it on the built model, on its device, before the optimizer is made and before
    torch.compile. Parameters are kept (the same tensors, the same state_dict keys), so an
    optimizer or a checkpoint made before works too. Refuses, in one line naming the precision
    and `model_name`, a model with no layer to convert.
    """
    precision = _recipe_precision(recipe)
    name = model_name or type(model).__name__
    linears = _convertible_linears(model, precision, name)
    float8 = _float8(precision)
    if auto_filter:
        # torchao's own (exported, marked experimental) filter, so that its thresholds are the
        # ones of the pinned release rather than a copy here.
        picks = float8._auto_filter_for_recipe(recipe, filter_fqns=[])
    else:

        def picks(module: nn.Linear, fqn: str) -> bool:
            out_features, in_features = module.weight.shape
            return in_features % 16 == 0 and out_features % 16 == 0

    chosen = {fqn for fqn, module in linears if picks(module, fqn)}
    if not chosen:
        what = f"torchao's {recipe} auto-filter" if auto_filter else "the multiple-of-16 rule"
        raise AmpbenchError(
            f"--precision {precision}: model {name} has no Linear layer float8 training can "
            f"convert ({what} skips {_describe(linears)}); float8 needs dims multiples of 16 "
            "and pays only on large matmuls: use bf16 or fp16 for this model"
        )
    config = dataclasses.replace(
        float8.Float8LinearConfig.from_recipe_name(recipe), emulate=emulate
    )
    float8.convert_to_float8_training(
        model,
        module_filter_fn=lambda module, fqn: fqn in chosen,
        config=config,
    )
    return len(chosen)
