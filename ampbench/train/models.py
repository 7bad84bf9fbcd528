"""The networks a run can train: the built-ins by name (MODELS), any torchvision classification
model by its name, and the user's own as `--model package.module:factory`.

Image shapes here are (channels, height, width), as the model sees a batch; the prepared data's
metadata keeps (height, width, channels), which config.model_input_shape turns into this.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ampbench.errors import AmpbenchError
from ampbench.train.config import check_model_name

ImageShape = tuple[int, int, int]  # (channels, height, width)


def _conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
        nn.MaxPool2d(2),
        nn.BatchNorm2d(c_out),
        nn.GELU(),
        nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.GELU(),
    )


def small_cnn(num_classes: int, width: int = 64) -> nn.Module:
    """A small fast network (airbench-style: three conv blocks, max pooling) for quick runs."""
    return nn.Sequential(
        nn.Conv2d(3, width // 2, 3, padding=1, bias=False),
        nn.BatchNorm2d(width // 2),
        nn.GELU(),
        _conv_block(width // 2, width),
        _conv_block(width, 2 * width),
        _conv_block(2 * width, 4 * width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(4 * width, num_classes),
    )


class TransformerBlock(nn.Module):
    """A pre-norm transformer block: attention and MLP, each nn.Linear layers around one op."""

    def __init__(self, dim: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp_dim)
        self.fc2 = nn.Linear(mlp_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(self.norm1(x)).view(batch, tokens, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (batch, heads, tokens, head_dim)
        # SDPA picks the fused (flash / memory-efficient) kernel the device and dtype allow.
        attended = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, tokens, dim))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class SmallViT(nn.Module):
    """A Vision Transformer for small images (`vit-s`), nearly all of its work in nn.Linear.

    Patches are cut by a reshape and embedded by a Linear (not the usual strided Conv2d), so
    that every matmul is a Linear a float8 recipe (torchao's convert_to_float8_training) can
    convert; every hidden size is a multiple of 16, as float8 matmuls require. Only the head's
    output (the class count) is not: float8 recipes leave the head in higher precision anyway.
    The tokens are mean-pooled instead of adding a class token: 64 tokens per 32x32 image (a
    multiple of 16 whenever the image's sides are) keep batch x tokens, the rows of every
    matmul, a multiple of 16 too, whatever the batch size.
    """

    def __init__(
        self,
        num_classes: int,
        image_shape: ImageShape,
        *,
        patch: int = 4,
        dim: int = 384,
        depth: int = 6,
        heads: int = 6,
        mlp_ratio: int = 4,
    ) -> None:
        super().__init__()
        channels, height, width = image_shape
        if height % patch or width % patch:
            raise ValueError(
                f"height and width must be multiples of the patch size {patch}, "
                f"not {height}x{width}"
            )
        self.patch = patch
        self.embed = nn.Linear(channels * patch * patch, dim)
        # Learned, one per patch position: its size fixes the image size the model takes.
        self.position = nn.Parameter(torch.zeros(1, (height // patch) * (width // patch), dim))
        self.blocks = nn.Sequential(
            *(TransformerBlock(dim, heads, mlp_ratio * dim) for _ in range(depth))
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        # The usual ViT initialisation (truncated normal, std 0.02; zero biases).
        nn.init.trunc_normal_(self.position, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = images.shape
        p = self.patch
        patches = (
            images.reshape(batch, channels, height // p, p, width // p, p)
            .permute(0, 2, 4, 1, 3, 5)
            .reshape(batch, (height // p) * (width // p), channels * p * p)
        )
        tokens = self.blocks(self.embed(patches) + self.position)
        return self.head(self.norm(tokens).mean(dim=1))


def small_vit(num_classes: int, image_shape: ImageShape) -> SmallViT:
    """`vit-s`: patch 4 (64 tokens from a 32x32 image, each patch 48 values for RGB), width 384
    in 6 heads of 64 and MLP 1536, as ViT-S/DeiT-S (head size 64 is what the fused attention
    kernels are tuned for), but 6 blocks instead of 12: a 2-epoch CIFAR run stays short, and
    every matmul (K and N of at least 384, M = batch x 64) is still large enough for fp16, bf16
    or float8 tensor cores to show what they buy."""
    return SmallViT(num_classes, image_shape, patch=4, dim=384, depth=6, heads=6, mlp_ratio=4)


# -- torchvision ----------------------------------------------------------------------------------
def _torchvision() -> Any:
    """torchvision, imported where a model needs it: its models and ops take about 0.4 s to
    import on a CPU, which a training task of another model need not pay."""
    import torchvision

    return torchvision


def torchvision_models() -> list[str]:
    """torchvision's classification models, by name (its detection, segmentation and video
    models do not map images to class logits)."""
    models = _torchvision().models
    return models.list_models(module=models)


def _torchvision_options(name: str, image_shape: ImageShape) -> dict[str, Any]:
    """Keyword arguments that fit some torchvision builders to this engine and these images."""
    _, height, width = image_shape
    if name.startswith("vit_"):
        # Position embeddings sized for 224x224 unless told otherwise; with no pretrained
        # weights to match, they can fit the images (square ones: VisionTransformer checks).
        return {"image_size": height}
    if name == "maxvit_t":
        return {"input_size": (height, width)}  # its attention grids, sized like the above
    if name in ("googlenet", "inception_v3"):
        # Their auxiliary heads make a training-mode forward return a tuple, which the
        # engine's loss cannot take; init_weights=True is their documented future default.
        return {"aux_logits": False, "init_weights": True}
    return {}


# -- package.module:factory -----------------------------------------------------------------------
def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def load_factory(name: str) -> Callable[..., Any]:
    """The callable `package.module:factory` names (an attribute path after the colon may be
    dotted: `package.module:Class.build`). Import errors of any kind are one line naming
    --model."""
    module_name, _, attribute = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as error:  # not found, or its own code failed on import
        missing = error.name if isinstance(error, ModuleNotFoundError) else None
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            reason = (
                f"no module named '{missing}' (install it, or put the directory that holds "
                "it on PYTHONPATH)"
            )
        else:  # the module was found; its own code, or something it imports, failed
            reason = f"importing {module_name}: {_first_line(error)}"
        raise AmpbenchError(f"--model {name}: {reason}") from None
    target: Any = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise AmpbenchError(
                f"--model {name}: module {module_name} has no attribute '{attribute}'"
            ) from None
    if not callable(target):
        raise AmpbenchError(
            f"--model {name}: {module_name}.{attribute} is a {type(target).__name__}, not callable"
        )
    return target


# -- building and checking ------------------------------------------------------------------------
def _shape_text(image_shape: ImageShape) -> str:
    return "x".join(str(size) for size in image_shape)


def _cifar_resnet18(num_classes: int, image_shape: ImageShape) -> nn.Module:
    """The usual CIFAR adaptation: a 3x3 stride-1 stem and no max-pool keep 32x32 inputs from
    shrinking to 8x8 before the first residual stage."""
    model = _torchvision().models.resnet18(num_classes=num_classes)
    model.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model


# The builders of the built-in models, whose names the command line knows (train.MODELS).
BUILT_IN: dict[str, Callable[[int, ImageShape], nn.Module]] = {
    "resnet18": _cifar_resnet18,
    "resnet18-imagenet": lambda classes, _: _torchvision().models.resnet18(num_classes=classes),
    "small-cnn": lambda classes, _: small_cnn(classes),
    "vit-s": small_vit,
}


def _construct(name: str, num_classes: int, image_shape: ImageShape) -> nn.Module:
    """The model, or the exception its builder raised (AmpbenchError for a name or a factory
    that cannot be used at all: no retry, in check_model, could help those)."""
    if name in BUILT_IN:
        return BUILT_IN[name](num_classes, image_shape)
    check_model_name(name)  # one line for a name that is none of the forms
    if ":" in name:
        model = load_factory(name)(num_classes, image_shape)
        if not isinstance(model, nn.Module):
            raise AmpbenchError(
                f"--model {name}: the factory returned {type(model).__name__}, "
                "not a torch.nn.Module"
            )
        return model
    # weights=None: no download, and random weights are what a training benchmark starts from.
    options = _torchvision_options(name, image_shape)
    return _torchvision().models.get_model(name, weights=None, num_classes=num_classes, **options)


def build_model(name: str, num_classes: int, image_shape: ImageShape = (3, 32, 32)) -> nn.Module:
    """The network `name` means, with `num_classes` outputs, for images of `image_shape`
    (channels, height, width; the default is CIFAR's): a built-in (MODELS), a torchvision
    classification model by name (built with no weights), or `package.module:factory`.

    The user's factory is called as `factory(num_classes, image_shape)` and must return an
    nn.Module mapping float images (N, C, H, W) to logits (N, num_classes); see the README.
    Every failure is one AmpbenchError line naming --model.
    """
    image_shape = (int(image_shape[0]), int(image_shape[1]), int(image_shape[2]))
    try:
        return _construct(name, num_classes, image_shape)
    except AmpbenchError:
        raise
    except Exception as error:
        what = "the factory" if ":" in name else "building it"
        raise AmpbenchError(
            f"--model {name}: {what} failed for {_shape_text(image_shape)} images "
            f"(channels x height x width): {_first_line(error)}"
        ) from None


def _run_batch(
    model: nn.Module,
    name: str,
    num_classes: int,
    image_shape: ImageShape,
    device: torch.device | str,
) -> None:
    """Run a batch of 2 through the model on `device`, in training and in evaluation mode (the
    engine uses both), and check that the logits have the shape the loss needs. On the meta
    device a model built elsewhere runs with meta stand-ins for its parameters and buffers."""
    images = torch.zeros(2, *image_shape, device=device)
    images = images.contiguous(memory_format=torch.channels_last)  # as the engine's batches
    stand_ins = {
        key: torch.empty_like(value, device="meta")
        for key, value in (*model.named_parameters(), *model.named_buffers())
        if value.device != images.device
    }
    with torch.no_grad():
        for training in (True, False):
            model.train(training)
            if stand_ins:
                logits = torch.func.functional_call(model, stand_ins, (images,))
            else:
                logits = model(images)
            if not isinstance(logits, torch.Tensor):
                raise AmpbenchError(
                    f"--model {name}: returns {type(logits).__name__} for "
                    f"{_shape_text(image_shape)} images, not a tensor of logits"
                )
            if tuple(logits.shape) != (2, num_classes) or not logits.is_floating_point():
                raise AmpbenchError(
                    f"--model {name}: maps a batch of 2 {_shape_text(image_shape)} images "
                    f"(channels x height x width) to {logits.dtype} of shape "
                    f"{tuple(logits.shape)}, not logits of shape (2, {num_classes}) for "
                    f"{num_classes} classes"
                )


def check_model(name: str, num_classes: int, image_shape: ImageShape) -> None:
    """Refuse, in one line naming --model and the image shape, a model that cannot train on
    these images: it cannot be built for them, its forward fails (too small, wrong channels),
    or its output is not (N, num_classes) logits. Before any training: seconds, not a failed
    task. The random number generators are left as they were.

    Built and run on the meta device (shapes only: no memory, no arithmetic). A model whose
    construction computes with tensors (torchvision's RegNets) is built on the CPU and run on
    the meta device; one whose forward cannot run there (a .item(), say) runs on the CPU."""
    image_shape = (int(image_shape[0]), int(image_shape[1]), int(image_shape[2]))
    with torch.random.fork_rng(devices=[]):
        model = None
        try:
            with torch.device("meta"):
                model = _construct(name, num_classes, image_shape)
                _run_batch(model, name, num_classes, image_shape, "meta")
            return
        except AmpbenchError:
            raise
        except Exception:
            pass  # perhaps the meta device's fault: only the CPU's answer counts
        built_on_meta = model is not None
        model = build_model(name, num_classes, image_shape)  # one line if it cannot be built
        if not built_on_meta:
            try:
                with torch.device("meta"):
                    _run_batch(model, name, num_classes, image_shape, "meta")
                return
            except AmpbenchError:
                raise
            except Exception:
                pass
        try:
            _run_batch(model, name, num_classes, image_shape, "cpu")
        except AmpbenchError:
            raise
        except Exception as error:
            raise AmpbenchError(
                f"--model {name}: cannot take {_shape_text(image_shape)} images (channels x "
                f"height x width): {_first_line(error)}"
            ) from None


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
